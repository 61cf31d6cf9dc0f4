import { Metadata } from '@grpc/grpc-js';
import { afterEach, describe, expect, it } from 'vitest';
import { DEFAULT_MAX_ACK_ENTRIES, maxAckEntriesOf } from '../../src/client/ack-limit.js';
import { mathTask } from '../support/harness.js';
import { startServerHarness, TrajectoryReader, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

// The server advertises its per-Ack bound in the Rollout stream's `rollout-max-ack-entries` header, and a server may be
// configured below the protocol's 65,536 (sessions.maxAckEntries): an ack over it is refused whole, on the stream, and
// a client that does not split by the advertised bound silently leaves everything it acked unacked.

const harnesses: ServerHarness[] = [];
afterEach(async () => {
  await Promise.all(harnesses.splice(0).map((h) => h.close()));
});

describe('the TypeScript client against a server configured with a small ack bound', () => {
  it('splits its acks by the bound the server advertises: every trajectory acked, no ack refused', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null }, sessions: { maxAckEntries: 3 } } });
    harnesses.push(h);
    const session = h.client.openSession({ sessionId: 'small-acks', autoAck: false });
    await session.submit(mathTask('eight', 8, 5));
    const got = await new TrajectoryReader(session).take(8);
    expect(h.server.sessions.get('small-acks')?.unackedCount).toBe(8);
    session.ack(got.map((t) => ({ taskId: t.taskId, sampleIndex: t.sampleIndex })));
    await eventually(() => h.server.sessions.get('small-acks')?.unackedCount === 0, 'all eight acked, in acks of at most 3', 15_000);
  }, 120_000);

  it('splits acks of whole tasks by it too', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null }, sessions: { maxAckEntries: 2 } } });
    harnesses.push(h);
    const session = h.client.openSession({ sessionId: 'small-task-acks', autoAck: false });
    for (const id of ['a', 'b', 'c', 'd', 'e']) await session.submit(mathTask(id, 1, id.charCodeAt(0)));
    await new TrajectoryReader(session).take(5);
    expect(h.server.sessions.get('small-task-acks')?.unackedCount).toBe(5);
    session.ackTasks(['a', 'b', 'c', 'd', 'e']);
    await eventually(() => h.server.sessions.get('small-task-acks')?.unackedCount === 0, 'all five tasks acked', 15_000);
  }, 120_000);
});

describe('the advertised ack bound, as the client reads it', () => {
  const headers = (...values: string[]): Metadata => {
    const m = new Metadata();
    for (const v of values) m.add('rollout-max-ack-entries', v);
    return m;
  };

  it('is the header\'s positive integer', () => {
    expect(maxAckEntriesOf(headers('3'))).toBe(3);
    expect(maxAckEntriesOf(headers('65536'))).toBe(65_536);
  });

  it('falls back to 65,536 when an older server sends no header, and when the value is garbage or not positive', () => {
    expect(DEFAULT_MAX_ACK_ENTRIES).toBe(65_536);
    for (const m of [new Metadata(), headers(''), headers('0'), headers('-5'), headers('abc'), headers('3.5'), headers('1e3'), headers(' 7'), headers('99999999999999999999')]) {
      expect(maxAckEntriesOf(m)).toBe(DEFAULT_MAX_ACK_ENTRIES);
    }
  });

  it('is the smallest when the header is repeated (whatever sent it twice, the smaller bound is safe)', () => {
    expect(maxAckEntriesOf(headers('10', '4'))).toBe(4);
  });
});
