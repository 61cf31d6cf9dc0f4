import { credentials, type Metadata, status } from '@grpc/grpc-js';
import { afterEach, describe, expect, it } from 'vitest';
import { RolloutRequest, RolloutServiceClient, TaskSpec, type RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { MAX_ACK_ENTRIES } from '../../src/contract/session.js';
import { mathTask } from '../support/harness.js';
import { rawRollout } from '../support/raw-rollout.js';
import { startServerHarness, TrajectoryReader, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

// One Ack may list as many task ids and trajectory refs as maxMessageBytes holds (millions): applied in one go it
// would hold the event loop and put every one of them into the journal's transaction. It is bounded per message and
// refused by field, on the stream, which goes on.

const harnesses: ServerHarness[] = [];
afterEach(async () => {
  await Promise.all(harnesses.splice(0).map((h) => h.close()));
});

const request = (r: RolloutRequest): Uint8Array => RolloutRequest.encode(r).finish();
const rejections = (rs: RolloutResponse[]) => rs.flatMap((r) => (r.kind?.$case === 'rejected' ? [r.kind.value] : []));

describe('an ack listing more entries than a message may', () => {
  it.each([
    ['trajectories', { taskIds: [], trajectories: Array.from({ length: MAX_ACK_ENTRIES + 1 }, (_, i) => ({ taskId: `t${i}`, sampleIndex: 0 })) }, 'ack.trajectories'],
    ['task_ids', { taskIds: Array.from({ length: MAX_ACK_ENTRIES + 1 }, (_, i) => `t${i}`), trajectories: [] }, 'ack.task_ids'],
  ])('(%s) is rejected INVALID_ARGUMENT naming the field; the stream and its session go on', async (_name, ack, field) => {
    const h = await startServerHarness({ config: { journal: { dir: null } } });
    harnesses.push(h);
    const raw = rawRollout(h.server.address);
    try {
      raw.send(request({ kind: { $case: 'open', value: { sessionId: 'acker', resume: false, stageEvents: false } } }));
      raw.send(request({ kind: { $case: 'ack', value: ack } }));
      raw.send(request({ kind: { $case: 'task', value: TaskSpec.fromPartial(mathTask('after-ack', 1, 91)) } }));
      await eventually(() => raw.received.some((r) => r.kind?.$case === 'trajectory'), 'the task after the ack runs', 60_000);
      expect(rejections(raw.received)).toEqual([
        { taskId: '', field, code: status.INVALID_ARGUMENT, reason: expect.stringMatching(new RegExp(`^${field}: .*at most ${MAX_ACK_ENTRIES}.*got ${MAX_ACK_ENTRIES + 1}`)) },
      ]);
      raw.end();
      expect(await raw.status).toBe(status.OK);
    } finally {
      raw.client.close();
    }
  }, 120_000);

  it('sent by the TypeScript client, goes in parts the server takes: applied, nothing refused', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null } } });
    harnesses.push(h);
    const session = h.client.openSession({ sessionId: 'big-acker', autoAck: false });
    await session.submit(mathTask('one', 1, 93));
    const [t] = await new TrajectoryReader(session).take(1);
    session.ack([...Array.from({ length: MAX_ACK_ENTRIES }, (_, i) => ({ taskId: `x${i}`, sampleIndex: 0 })), { taskId: t!.taskId, sampleIndex: t!.sampleIndex }]);
    // Before the client split it: refused whole (ack.trajectories), the real ref with it.
    await eventually(() => h.server.sessions.get('big-acker')?.unackedCount === 0, 'the ack applied', 30_000);
  }, 120_000);

  it('at the limit is applied', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null } } });
    harnesses.push(h);
    const session = h.client.openSession({ sessionId: 'acker', autoAck: false });
    await session.submit(mathTask('one', 1, 92));
    const [t] = await new TrajectoryReader(session).take(1);
    expect(h.server.sessions.get('acker')?.unackedCount).toBe(1);
    session.ack([{ taskId: t!.taskId, sampleIndex: t!.sampleIndex }, ...Array.from({ length: MAX_ACK_ENTRIES - 1 }, (_, i) => ({ taskId: `x${i}`, sampleIndex: 0 }))]);
    await eventually(() => h.server.sessions.get('acker')?.unackedCount === 0, 'the ack applied', 30_000);
  }, 120_000);
});

describe('the ack bound', () => {
  it('is advertised before the first answer, in the Rollout stream\'s initial metadata (rollout-max-ack-entries)', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null } } });
    harnesses.push(h);
    const client = new RolloutServiceClient(h.server.address, credentials.createInsecure());
    try {
      const call = client.rollout();
      const headers = new Promise<Metadata>((resolve) => call.on('metadata', resolve));
      const opened = new Promise<void>((resolve) => call.on('data', (r: RolloutResponse) => r.kind?.$case === 'opened' && resolve()));
      call.on('error', () => undefined);
      call.write({ kind: { $case: 'open', value: { sessionId: '', resume: false, stageEvents: false } } });
      await opened;
      expect((await headers).get('rollout-max-ack-entries')).toEqual([String(MAX_ACK_ENTRIES)]);
      call.end();
    } finally {
      client.close();
    }
  }, 60_000);
});
