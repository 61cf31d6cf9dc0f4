import { status } from '@grpc/grpc-js';
import { afterEach, describe, expect, it } from 'vitest';
import { RolloutRequest, TaskSpec } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { rawRollout } from '../support/raw-rollout.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';

// A client that half-closes says it will send nothing more - no ack either. Trajectories the session held back for
// acks (delivery paused at sessions.maxUnackedBytes) could then never be released: the server waited for them to be
// sent before ending the stream, and the stream never ended (found by review, helper-52; grpcurl or any client that
// half-closes and reads to the end). Once the client half-closes, what the session holds and what still finishes is
// sent regardless of the bound (it is in the server's memory either way; no new task can come on that stream).

const harnesses: ServerHarness[] = [];
afterEach(async () => {
  await Promise.all(harnesses.splice(0).map((h) => h.close()));
});

const request = (r: RolloutRequest): Uint8Array => RolloutRequest.encode(r).finish();

describe('a client that half-closes while delivery is paused', () => {
  it('gets every trajectory, held ones included, and the stream ends OK; the unacked ones stay resumable', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null }, sessions: { maxUnackedBytes: 1 } } });
    harnesses.push(h);
    const raw = rawRollout(h.server.address);
    try {
      raw.send(request({ kind: { $case: 'open', value: { sessionId: 'half-closer', resume: false, stageEvents: false } } }));
      raw.send(request({ kind: { $case: 'task', value: TaskSpec.fromPartial(mathTask('hc', 3, 94)) } }));
      // One sent, the two others finished and held (the bound is one byte): nothing acks them.
      await eventually(() => h.server.sessions.get('half-closer')?.heldCount === 2, 'two trajectories held', 60_000);
      raw.end();
      expect(await within(raw.status, 15_000, 'the end of the stream')).toBe(status.OK);
      const samples = raw.received.flatMap((r) => (r.kind?.$case === 'trajectory' ? [r.kind.value.sampleIndex] : []));
      expect(samples.sort()).toEqual([0, 1, 2]);
      // Not acked: kept for a resume (at least once), not dropped.
      expect(h.server.sessions.get('half-closer')?.unackedCount).toBe(3);
    } finally {
      raw.client.close();
    }
  }, 120_000);

  it('a sample that finishes after the half-close is sent too, past the bound', async () => {
    const h = await startServerHarness({ engine: { tokenLatencyMs: 30 }, config: { journal: { dir: null }, sessions: { maxUnackedBytes: 1 } } });
    harnesses.push(h);
    const raw = rawRollout(h.server.address);
    try {
      raw.send(request({ kind: { $case: 'open', value: { sessionId: 'half-closer-early', resume: false, stageEvents: false } } }));
      raw.send(request({ kind: { $case: 'task', value: TaskSpec.fromPartial(mathTask('hc-early', 2, 95)) } }));
      await eventually(() => raw.received.some((r) => r.kind?.$case === 'accepted'), 'the task accepted', 30_000);
      raw.end(); // before any sample has finished
      expect(await within(raw.status, 60_000, 'the end of the stream')).toBe(status.OK);
      const samples = raw.received.flatMap((r) => (r.kind?.$case === 'trajectory' ? [r.kind.value.sampleIndex] : []));
      expect(samples.sort()).toEqual([0, 1]);
    } finally {
      raw.client.close();
    }
  }, 120_000);
});
