import { status, type ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskRejectedError } from '../../src/client/rollout-client.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, mathTask, startHarness, type Harness } from '../support/harness.js';

describe('oversized input', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ maxInstanceBytes: 16 * 1024, maxMessageBytes: 256 * 1024 });
  });
  afterAll(async () => h?.close());

  it('an instance over its limit is rejected naming the field; the stream goes on', async () => {
    const session = h.client.openSession();
    const err = await session.submit(mathTask('big-instance', 1, 1, { instance: { problem: 'y'.repeat(32 * 1024), answer: '1' } })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TaskRejectedError);
    expect((err as TaskRejectedError).field).toBe('instance');
    expect((err as TaskRejectedError).reason).toMatch(/too large/);
    await session.submit(mathTask('after-big-instance', 1, 2));
    session.close();
    const [t] = await collect(session.trajectories());
    expect(t?.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
  });

  it('a request over the message limit is rejected naming its largest field; the stream and its tasks go on', async () => {
    const session = h.client.openSession();
    const before = session.submit(mathTask('before-big-message', 1, 6));
    const err = await session.submit(mathTask('big-message', 1, 7, { metadata: { blob: 'z'.repeat(512 * 1024) } })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TaskRejectedError);
    expect((err as TaskRejectedError).taskId).toBe('big-message');
    expect((err as TaskRejectedError).field).toBe('metadata');
    expect((err as TaskRejectedError).reason).toMatch(/over the 262144-byte limit/);
    const after = session.submit(mathTask('after-big-message', 1, 8));
    await Promise.all([before, after]);
    session.close();
    const done = (await collect(session.trajectories())).map((t) => `${t.taskId}#${TrajectoryStatus[t.status]}`).sort();
    expect(done).toEqual(['after-big-message#TRAJECTORY_STATUS_COMPLETED', 'before-big-message#TRAJECTORY_STATUS_COMPLETED']);
  });

  it('a message over the transport limit ends that stream with RESOURCE_EXHAUSTED, loses nothing accepted, and the server keeps serving', async () => {
    const s1 = h.client.openSession({ sessionId: 'oversize', autoAck: false });
    await s1.submit(mathTask('before-huge', 2, 3));
    // Four times the message limit is where the transport itself refuses (before any handler can answer).
    const huge = s1.submit(mathTask('huge', 1, 4, { metadata: { blob: 'z'.repeat(1200 * 1024) } })).catch((e: unknown) => e);
    const received: string[] = [];
    const failure = await (async () => {
      try {
        for await (const t of s1.trajectories()) received.push(`${t.taskId}#${t.sampleIndex}`);
        return undefined;
      } catch (e) {
        return e as ServiceError;
      }
    })();
    expect(failure?.code).toBe(status.RESOURCE_EXHAUSTED);
    expect(await huge).toBeInstanceOf(Error);

    // The session survives the broken stream: resuming it delivers what was accepted before.
    const s2 = h.client.openSession({ sessionId: 'oversize', resume: true });
    await s2.opened;
    s2.close();
    const rest = (await collect(s2.trajectories())).map((t) => `${t.taskId}#${t.sampleIndex}`);
    expect(new Set([...received, ...rest])).toEqual(new Set(['before-huge#0', 'before-huge#1']));

    const after = await h.client.submit(mathTask('after-huge', 1, 5));
    expect(after.duplicate).toBe(false);
    const done = await h.client.getTrajectory('after-huge', { wait: true, deadlineMs: 30_000 });
    expect(done.trajectories[0]?.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
  });
});
