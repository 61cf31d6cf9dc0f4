import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type TaskAccepted } from '../../gen/ts/rollout/v1/rollout.js';
import { TaskRejectedError } from '../../src/client/rollout-client.js';
import { collect, mathTask } from '../support/harness.js';
import { eventually } from '../support/wait.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

const MAX_ADMITTED = 4;
const OK = new Set([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED]);

/** Watches the server's admission and pipeline counters on every pipeline event and on a timer; keeps the maxima. */
function monitor(h: ServerHarness) {
  const { runtime } = h.server;
  const max = { admitted: 0, pipeline: 0, waiting: 0, storedUnfinished: 0 };
  const storedBefore = runtime.store.size;
  let finished = 0;
  const sample = (): void => {
    max.admitted = Math.max(max.admitted, runtime.admission.inFlight);
    max.pipeline = Math.max(max.pipeline, runtime.pipeline.inFlight);
    max.waiting = Math.max(max.waiting, runtime.admission.waiting);
    // Tasks the server has taken off the streams and not finished: what it buffers.
    max.storedUnfinished = Math.max(max.storedUnfinished, runtime.store.size - storedBefore - finished);
  };
  const events = runtime.pipeline.events$.subscribe((e) => {
    if (e.type === 'finished') finished++;
    sample();
  });
  const timer = setInterval(sample, 5);
  return {
    max,
    stop: () => {
      events.unsubscribe();
      clearInterval(timer);
    },
  };
}

describe('bounded admission end to end: a full server stops reading the stream instead of buffering', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    // Every task has one sample, so "samples admitted" and "tasks taken off the stream" coincide.
    h = await startServerHarness({ config: { maxAdmitted: MAX_ADMITTED }, engine: { tokenLatencyMs: 4 } });
  });
  afterAll(async () => h?.close());

  it('never admits more than maxAdmitted samples, yet completes every one of 20 tasks pushed at once, exactly once', async () => {
    const m = monitor(h);
    try {
      const session = h.client.openSession();
      const ids = Array.from({ length: 20 }, (_, i) => `flood-${i}`);
      // Pushed without waiting for any acceptance: the client's writes pile up in gRPC flow control.
      const accepted: Promise<TaskAccepted>[] = ids.map((id, i) => session.submit(mathTask(id, 1, 1_000 + i)));
      session.close();
      const trajectories = await collect(session.trajectories());
      expect((await Promise.all(accepted)).map((a) => a.taskId)).toEqual(ids);

      expect(trajectories.map((t) => t.taskId).sort()).toEqual([...ids].sort());
      for (const t of trajectories) expect(OK.has(t.status), `${t.taskId}: ${TrajectoryStatus[t.status]} ${t.error}`).toBe(true);
      expect(m.max.admitted).toBeLessThanOrEqual(MAX_ADMITTED);
      expect(m.max.pipeline).toBeLessThanOrEqual(MAX_ADMITTED);
      expect(m.max.storedUnfinished).toBeLessThanOrEqual(MAX_ADMITTED);
      // One stream holds at most the one request it is waiting to admit: the rest stay unread on the wire.
      expect(m.max.waiting).toBeLessThanOrEqual(1);
      // The bound was actually the constraint.
      expect(m.max.admitted).toBe(MAX_ADMITTED);
      expect(h.server.runtime.admission.inFlight).toBe(0);
    } finally {
      m.stop();
    }
  });

  it('shares the bound between two streams and a unary Submit, and serves them all', async () => {
    const m = monitor(h);
    try {
      const a = h.client.openSession();
      const b = h.client.openSession();
      const idsA = Array.from({ length: 8 }, (_, i) => `two-a-${i}`);
      const idsB = Array.from({ length: 8 }, (_, i) => `two-b-${i}`);
      idsA.forEach((id, i) => void a.submit(mathTask(id, 1, 2_000 + i)));
      idsB.forEach((id, i) => void b.submit(mathTask(id, 1, 3_000 + i)));
      const unary = h.client.submit(mathTask('two-unary', 1, 4_000));
      a.close();
      b.close();
      const [ta, tb] = await Promise.all([collect(a.trajectories()), collect(b.trajectories())]);
      await unary;
      const viaUnary = await h.client.getTrajectory('two-unary', { wait: true, deadlineMs: 30_000 });

      expect(ta.map((t) => t.taskId).sort()).toEqual([...idsA].sort());
      expect(tb.map((t) => t.taskId).sort()).toEqual([...idsB].sort());
      expect(viaUnary.pending).toBe(0);
      expect(m.max.admitted).toBeLessThanOrEqual(MAX_ADMITTED);
      expect(m.max.pipeline).toBeLessThanOrEqual(MAX_ADMITTED);
      // Each of the three callers holds at most one request while it waits.
      expect(m.max.waiting).toBeLessThanOrEqual(3);
    } finally {
      m.stop();
    }
  });

  it('a conflicting re-use of a task_id that raced through admission is rejected without leaking capacity', async () => {
    const { runtime } = h.server;
    // Fill the server with a task whose engine requests hang until it is cancelled.
    h.engine.failNext(MAX_ADMITTED, { kind: 'hang' });
    // `received` counts since the engine started: the blocker's own requests must reach it (and take the hangs).
    const receivedBefore = h.engine.stats().received;
    await h.client.submit(mathTask('race-blocker', MAX_ADMITTED, 5_000));
    await eventually(() => h.engine.stats().received >= receivedBefore + MAX_ADMITTED, 'the blocker to hold every slot');

    // Two streams submit the same task_id with different specs while the server is full: both wait.
    const first = h.client.openSession();
    const second = h.client.openSession();
    const accepted = first.submit(mathTask('race-dup', 1, 5_001));
    await eventually(() => runtime.admission.waiting === 1, 'the first submit to wait for admission');
    const conflicting = second.submit(mathTask('race-dup', 1, 5_002)).then(
      () => undefined,
      (err: unknown) => err,
    );
    await eventually(() => runtime.admission.waiting === 2, 'the second submit to wait for admission');

    await h.client.cancel('race-blocker');
    expect((await accepted).taskId).toBe('race-dup');
    const err = await conflicting;
    expect(err).toBeInstanceOf(TaskRejectedError);
    expect((err as TaskRejectedError).field).toBe('task_id');
    first.close();
    second.close();
    const [t] = await collect(first.trajectories());
    await collect(second.trajectories());
    expect(t!.taskId).toBe('race-dup');

    // Everything has finished: every admitted sample must have been given back.
    await eventually(() => runtime.pipeline.inFlight === 0, 'the pipeline to be empty');
    await eventually(() => runtime.admission.inFlight === 0, 'admission to be back to zero', 3_000).catch(() => undefined);
    expect(runtime.admission.inFlight).toBe(0);
  });

  it('a cancel right behind a task waiting for admission is read at once: the running task is cancelled, the waiting one never starts', async () => {
    const { runtime } = h.server;
    h.engine.failNext(MAX_ADMITTED, { kind: 'hang' });
    const receivedBefore = h.engine.stats().received;
    const session = h.client.openSession();
    await session.submit(mathTask('full-blocker', MAX_ADMITTED, 6_000));
    await eventually(() => runtime.admission.inFlight === MAX_ADMITTED, 'the blocker to fill the server');
    await eventually(() => h.engine.stats().received >= receivedBefore + MAX_ADMITTED, 'the blocker to take every hang');
    const waiting = session.submit(mathTask('full-waiter', 1, 6_001)).then(
      () => undefined,
      (err: unknown) => err,
    );
    await eventually(() => runtime.admission.waiting === 1, 'the second task to wait for admission');
    // Both cancels arrive behind the waiting task on the same stream.
    session.cancel('full-waiter');
    const err = await waiting;
    expect(err).toBeInstanceOf(TaskRejectedError);
    expect((err as TaskRejectedError).reason).toMatch(/cancelled before it was admitted/);
    expect(runtime.store.get('full-waiter')).toBeUndefined();
    session.cancel('full-blocker');
    session.close();
    const trajectories = await collect(session.trajectories());
    expect(trajectories.map((t) => t.status)).toEqual(new Array(MAX_ADMITTED).fill(TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED));
    await eventually(() => runtime.admission.inFlight === 0, 'admission to be back to zero');
  });
});
