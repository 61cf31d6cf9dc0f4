import { getEventListeners } from 'node:events';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

/**
 * A trainer's week-long run compressed: thousands of streams, sessions, tasks and unary calls through one real server
 * (in process, the fake vLLM engine double, no sandboxes). Whatever lives longer than one task must come back to its
 * size before the run — listeners on the server's long-lived signals, subscribers of the pipeline's event bus,
 * sessions, admitted capacity, leases — and what is retained on purpose stays within its bound.
 */
const CYCLES = 2_000;
const RETAIN = 100;

describe('a long run leaves nothing behind per stream, session or task', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({
      engine: { policy: () => 'The answer is 4.' },
      sandboxes: new NullSandboxDriver(),
      config: { retainFinishedTasks: RETAIN, sessions: { ttlMs: 200 } },
    });
  });
  afterAll(async () => h?.close());

  /** What must return to its start size once the work in flight has ended. */
  const snapshot = (): Record<string, number> => {
    const { runtime, pool, sessions } = h.server;
    const { lifecycle, pipeline } = runtime;
    return {
      admissionListeners: getEventListeners(lifecycle.admission, 'abort').length,
      lifetimeListeners: getEventListeners(lifecycle.signal, 'abort').length,
      eventSubscribers: pipeline.events$.observers.length,
      sessions: sessions.size,
      admitted: runtime.admission.inFlight,
      waitingAdmission: runtime.admission.waiting,
      inFlight: pipeline.inFlight,
      leases: pool.stats().leases,
      inflightRequests: pool.stats().inflightRequests,
    };
  };
  const settled = async (what: string): Promise<void> => {
    await eventually(() => h.server.runtime.pipeline.inFlight === 0 && h.server.pool.stats().leases === 0, what, 60_000);
  };

  it(`${CYCLES} streams, each its own session and task, closed cleanly: back to the start, the store within its retention`, async () => {
    await settled('an idle server');
    const before = snapshot();
    let next = 0;
    const worker = async (): Promise<void> => {
      for (let i = next++; i < CYCLES; i = next++) {
        const session = h.client.openSession({ sessionId: `clean-${i}` });
        await session.submit(mathTask(`clean-${i}`, 1, i));
        session.close();
        for await (const t of session.trajectories()) expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
      }
    };
    await Promise.all(Array.from({ length: 16 }, worker));
    await settled('the last tasks');
    await eventually(() => h.server.sessions.size === before.sessions, 'the closed sessions to be dropped', 10_000);
    expect(snapshot()).toEqual(before);
    expect(h.server.runtime.store.size).toBeLessThanOrEqual(RETAIN);
  }, 240_000);

  it(`${CYCLES} unary submits and waiting GetTrajectory calls leave no listener on the server's signals`, async () => {
    await settled('an idle server');
    const before = snapshot();
    let next = 0;
    const worker = async (): Promise<void> => {
      for (let i = next++; i < CYCLES; i = next++) {
        await h.client.submit(mathTask(`unary-${i}`, 1, i));
        const got = await h.client.getTrajectory(`unary-${i}`, { wait: true, deadlineMs: 30_000 });
        expect(got.pending).toBe(0);
      }
    };
    await Promise.all(Array.from({ length: 16 }, worker));
    await settled('the last tasks');
    expect(snapshot()).toEqual(before);
    expect(h.server.runtime.store.size).toBeLessThanOrEqual(RETAIN);
  }, 240_000);

  it('streams dropped by their clients mid-task: their sessions expire, nothing of them stays', async () => {
    await settled('an idle server');
    const before = snapshot();
    const n = 500;
    let next = 0;
    const worker = async (): Promise<void> => {
      for (let i = next++; i < n; i = next++) {
        const session = h.client.openSession({ sessionId: `dropped-${i}` });
        await session.submit(mathTask(`dropped-${i}`, 2, i));
        session.abort();
        await session.trajectories().next().catch(() => undefined);
      }
    };
    await Promise.all(Array.from({ length: 16 }, worker));
    await settled('the dropped streams\' tasks');
    await eventually(() => h.server.sessions.size === before.sessions, 'the detached sessions to expire', 10_000);
    expect(snapshot()).toEqual(before);
  }, 240_000);
});

describe('a long run leaves nothing behind per watch or per backend added and removed', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({ engine: { policy: () => 'The answer is 4.' }, sandboxes: new NullSandboxDriver() });
  });
  afterAll(async () => h?.close());

  /** Sockets and timers this process holds (engine connections, per-backend timers). */
  const handles = (): Record<string, number> => {
    const out: Record<string, number> = {};
    for (const kind of process.getActiveResourcesInfo()) out[kind] = (out[kind] ?? 0) + 1;
    return { sockets: out.TCPSocketWrap ?? 0, timers: out.Timeout ?? 0 };
  };

  it(`${CYCLES} AddBackend / RemoveBackend cycles, each backend serving a task: no backend, connection or timer stays`, async () => {
    const { pool } = h.server;
    await eventually(() => pool.stats().leases === 0, 'an idle pool');
    const backendsBefore = pool.list().length;
    const handlesBefore = handles();
    for (let i = 0; i < CYCLES; i++) {
      const added = await h.client.addBackend({ url: h.engine.url, id: `cycled-${i}`, maxConcurrency: 4 });
      expect(added?.id).toBe(`cycled-${i}`);
      if (i % 20 === 0) {
        await h.client.submit(mathTask(`on-cycled-${i}`, 1, i));
        await h.client.getTrajectory(`on-cycled-${i}`, { wait: true, deadlineMs: 30_000 });
      }
      await h.client.removeBackend(`cycled-${i}`, i % 2 === 0);
    }
    await eventually(() => pool.stats().leases === 0, 'the last lease to go');
    expect(pool.list().length).toBe(backendsBefore);
    expect(pool.stats()).toMatchObject({ backends: backendsBefore, eligible: backendsBefore, leases: 0, waitingAcquires: 0, inflightRequests: 0 });
    await eventually(() => handles().sockets <= handlesBefore.sockets + 4, `engine connections to close (${JSON.stringify(handles())} vs ${JSON.stringify(handlesBefore)})`);
    expect(handles().timers).toBeLessThanOrEqual(handlesBefore.timers + 4);
  }, 240_000);

  it('150 watches (more than watch.maxOpen) opened and cancelled: no subscriber or listener stays', async () => {
    const { lifecycle, pipeline } = h.server.runtime;
    const before = [getEventListeners(lifecycle.signal, 'abort').length, pipeline.events$.observers.length];
    for (let i = 0; i < 150; i++) {
      const watch = h.client.watch({ statsIntervalMs: 100, stageEvents: true });
      const it = watch[Symbol.asyncIterator]();
      if (i % 50 === 0) await h.client.submit(mathTask(`watched-${i}`, 1, i));
      // Cancelled once it is serving (its first message came): a call cancelled the instant it is made may never tell
      // the server (see the report on half-open watches).
      await it.next();
      watch.cancel();
      await it.next().catch(() => undefined);
    }
    await eventually(
      () => getEventListeners(lifecycle.signal, 'abort').length === before[0] && pipeline.events$.observers.length === before[1],
      'the cancelled watches to be gone',
    );
    // Their slots are free again: a new watch is served (not RESOURCE_EXHAUSTED at watch.maxOpen).
    const watch = h.client.watch({ statsIntervalMs: 100 });
    const first = await watch[Symbol.asyncIterator]().next();
    expect(first.value?.kind?.$case).toBe('stats');
    watch.cancel();
  }, 120_000);
});
