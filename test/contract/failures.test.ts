import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { silentLogger } from '../../src/observability/logger.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { SandboxDriver } from '../../src/sandboxes/types.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { deadUrl, limits, startServerHarness, TrajectoryReader, liveSandboxes, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

const S = TrajectoryStatus;
const OK = new Set([S.TRAJECTORY_STATUS_COMPLETED, S.TRAJECTORY_STATUS_TRUNCATED]);
const name = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex} ${TrajectoryStatus[t.status]} ${t.error}`;

/** An infrastructure failure as the trainer must see it: filterable status, no reward, the cause in `error`. */
function expectInfraFailure(t: Trajectory, status: TrajectoryStatus, errorPattern: RegExp): void {
  expect(TrajectoryStatus[t.status], name(t)).toBe(TrajectoryStatus[status]);
  expect(t.reward).toBe(0);
  expect(t.rewardDetails).toEqual({});
  expect(t.error).toMatch(errorPattern);
  expect(invariantViolations(t)).toEqual([]);
}

/** Submits one task on a fresh stream and returns its trajectories. */
async function runTask(h: ServerHarness, task: TaskInput): Promise<Trajectory[]> {
  const session = h.client.openSession();
  await session.submit(task);
  session.close();
  return collect(session.trajectories());
}

const harnesses: ServerHarness[] = [];
async function harness(options: Parameters<typeof startServerHarness>[0] = {}): Promise<ServerHarness> {
  const h = await startServerHarness(options);
  harnesses.push(h);
  return h;
}
afterEach(async () => {
  for (const h of harnesses.splice(0)) await h.close();
});

describe('engine failures become BACKEND_ERROR trajectories, and the server keeps serving', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness();
  });
  afterAll(async () => h?.close());

  it('HTTP 500 from the engine fails exactly the samples it hit; later tasks on the same stream complete', async () => {
    const session = h.client.openSession();
    const reader = new TrajectoryReader(session);
    // The first two completion requests fail. Each belongs to a different sample: a sample whose request fails
    // sends no other, so the first two requests the engine sees are two samples' first turns.
    h.engine.failNext(2, { kind: 'status', status: 500, message: 'CUDA error: an illegal memory access' });
    await session.submit(mathTask('http500', 4, 501));
    const group = await reader.take(4);
    const failed = group.filter((t) => t.status === S.TRAJECTORY_STATUS_BACKEND_ERROR);
    expect(failed.map(name)).toHaveLength(2);
    for (const t of failed) {
      expectInfraFailure(t, S.TRAJECTORY_STATUS_BACKEND_ERROR, /backend_error: .*HTTP 500/);
      expect(t.finishReason).toBe('error');
    }
    for (const t of group.filter((x) => !failed.includes(x))) expect(OK.has(t.status), name(t)).toBe(true);

    await session.submit(mathTask('after-500', 3, 502));
    session.close();
    const later = await reader.rest();
    expect(later.map((t) => t.taskId)).toEqual(['after-500', 'after-500', 'after-500']);
    for (const t of later) expect(OK.has(t.status), name(t)).toBe(true);
  });

  it('a connection the engine drops mid-request is sent again (the engine still answers its health check); one that drops every time is a BACKEND_ERROR', async () => {
    h.engine.failNext(1, { kind: 'drop' });
    const [t] = await runTask(h, mathTask('dropped', 1, 503));
    expect(OK.has(t!.status), name(t!)).toBe(true);
    // The pool's default: 3 more attempts after the first, then the cause.
    h.engine.failNext(4, { kind: 'drop' });
    const [lost] = await runTask(h, mathTask('dropped-always', 1, 504));
    expectInfraFailure(lost!, S.TRAJECTORY_STATUS_BACKEND_ERROR, /lost its backend 4 times .*unreachable/);
    const [next] = await runTask(h, mathTask('after-drop', 1, 5041));
    expect(OK.has(next!.status), name(next!)).toBe(true);
  });

  it('no backend at all: BACKEND_ERROR once the acquire timeout passes, and recovery when one is added back', async () => {
    const slowAcquire = await harness({ config: { backendAcquireTimeoutMs: 300 } });
    const [only] = await slowAcquire.client.listBackends();
    await slowAcquire.client.removeBackend(only!.id);
    const started = Date.now();
    const [t] = await runTask(slowAcquire, mathTask('no-backend', 1, 505));
    const waited = Date.now() - started;
    expectInfraFailure(t!, S.TRAJECTORY_STATUS_BACKEND_ERROR, /no eligible backend within 300 ms/);
    expect(waited).toBeGreaterThanOrEqual(250); // it waited for the acquire timeout...
    expect(waited).toBeLessThan(15_000); // ...and not much longer
    expect(slowAcquire.engine.stats().received).toBe(0);

    await slowAcquire.client.addBackend({ url: slowAcquire.engine.url, maxConcurrency: 8 });
    const [back] = await runTask(slowAcquire, mathTask('backend-back', 1, 506));
    expect(OK.has(back!.status), name(back!)).toBe(true);
  });

  it('an engine nobody listens on (connection refused) is a BACKEND_ERROR', async () => {
    // The engine is marked unhealthy at the first refusal; the request then waits for another backend (bounded).
    const refused = await harness({ config: { backends: [{ url: await deadUrl(), maxConcurrency: 4 }], backendAcquireTimeoutMs: 500 } });
    const trajectories = await runTask(refused, mathTask('refused', 2, 507));
    expect(trajectories).toHaveLength(2);
    // The sample that met the refusal names it; one placed after it was marked unhealthy says so.
    for (const t of trajectories) expectInfraFailure(t, S.TRAJECTORY_STATUS_BACKEND_ERROR, /backend_error: .*(unreachable: ECONNREFUSED|unhealthy)/);
    expect(trajectories.some((t) => /unreachable: ECONNREFUSED/.test(t.error))).toBe(true);
  });
});

describe('timeouts against a slow engine', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    // ~30 generated tokens per turn at 60 ms each: a turn takes well over a second.
    h = await startServerHarness({ engine: { tokenLatencyMs: 60 } });
  });
  afterAll(async () => h?.close());

  it('limits.run_timeout_ms cuts the run: TIMEOUT, the engine request is abandoned and the backend released', async () => {
    const trajectories = await runTask(h, mathTask('run-timeout', 2, 601, { limits: limits({ runTimeoutMs: 300 }) }));
    expect(trajectories).toHaveLength(2);
    for (const t of trajectories) {
      expectInfraFailure(t, S.TRAJECTORY_STATUS_TIMEOUT, /run stage timed out after 300 ms/);
      expect(t.finishReason).toBe('timeout');
    }
    await eventually(() => h.engine.stats().disconnected >= 2, 'the engine to see both requests abandoned');
    await eventually(() => h.server.pool.stats().leases === 0 && h.server.pool.stats().inflightTrajectories === 0, 'backend leases released');
  });

  it('limits.total_timeout_ms bounds the whole sample: TIMEOUT', async () => {
    const [t] = await runTask(h, mathTask('total-timeout', 1, 602, { limits: limits({ totalTimeoutMs: 500 }) }));
    expectInfraFailure(t!, S.TRAJECTORY_STATUS_TIMEOUT, /total timeout of 500 ms exceeded/);
    expect(t!.finishReason).toBe('timeout');
  });
});

describe('sandbox failures become SANDBOX_ERROR trajectories', () => {
  it('a driver whose start throws: SANDBOX_ERROR, and the engine is never asked', async () => {
    const broken: SandboxDriver = {
      name: 'broken',
      start: async () => {
        throw new Error('ENOSPC: no space left on device, mkdtemp');
      },
    };
    const h = await harness({ sandboxes: broken });
    const trajectories = await runTask(h, mathTask('broken-driver', 2, 701));
    expect(trajectories).toHaveLength(2);
    for (const t of trajectories) {
      expectInfraFailure(t, S.TRAJECTORY_STATUS_SANDBOX_ERROR, /sandbox_error: ENOSPC/);
      expect(t.finishReason).toBe('error');
    }
    expect(h.engine.stats().received).toBe(0);
  });

  it('bubblewrap that cannot run (bogus bwrap path): SANDBOX_ERROR naming the cause', async () => {
    const h = await harness({ sandboxes: new BubblewrapDriver({ logger: silentLogger(), bwrapPath: '/nonexistent/bin/bwrap' }) });
    const [t] = await runTask(h, mathTask('no-bwrap', 1, 702));
    expectInfraFailure(t!, S.TRAJECTORY_STATUS_SANDBOX_ERROR, /cannot run \/nonexistent\/bin\/bwrap/);
    expect(h.engine.stats().received).toBe(0);
  });

  it('a sandbox that dies under the episode: SANDBOX_ERROR, not a tool error scored as the model\u2019s fault', async () => {
    const real = new BubblewrapDriver({ logger: silentLogger() });
    let killed = 0;
    const dying: SandboxDriver = {
      name: 'dying',
      start: async (spec, signal) => {
        const sandbox = await real.start(spec, signal);
        await sandbox.stop(); // "OOM-killed" before the model's first tool call reaches it
        killed++;
        return sandbox;
      },
    };
    const h = await harness({ sandboxes: dying });
    const [t] = await runTask(h, mathTask('dying-sandbox', 1, 703));
    expectInfraFailure(t!, S.TRAJECTORY_STATUS_SANDBOX_ERROR, /sandbox_error: sandbox .* is stopped/);
    expect(killed).toBe(1);
    expect(h.engine.stats().served).toBeGreaterThanOrEqual(1);
  });
});

describe('no sandboxes are left behind', () => {
  it('after a batch with completed, cancelled (queued and running), failed and timed-out samples', async () => {
    // The engine fails every request of the task seeded 880 (the agent loop sends seed + 1000 * sample + turn;
    // the other tasks' seeds, 801-807 plus at most 8 turns, stay below 880).
    const h = await harness({
      engine: { tokenLatencyMs: 8, inject: ({ body }) => (Number(body.seed) % 1000 >= 880 ? { kind: 'status', status: 500 } : undefined) },
    });
    let maxDirs = 0;
    const poll = setInterval(() => void liveSandboxes().then((d) => (maxDirs = Math.max(maxDirs, d.length))), 20);
    try {
      const session = h.client.openSession();
      const tasks = [
        mathTask('leak-ok-0', 2, 801),
        mathTask('leak-ok-1', 2, 802),
        mathTask('leak-cancel-early', 2, 803),
        mathTask('leak-cancel-running', 2, 804),
        mathTask('leak-init-timeout', 1, 805, { limits: limits({ initTimeoutMs: 1 }) }),
        mathTask('leak-run-timeout', 2, 806, { limits: limits({ runTimeoutMs: 150 }) }),
        mathTask('leak-ok-2', 3, 807),
        mathTask('leak-backend-error', 2, 880),
      ];
      for (const task of tasks) await session.submit(task);
      session.cancel('leak-cancel-early');
      await eventually(async () => (await liveSandboxes()).length > 0, 'sandboxes to exist');
      await eventually(() => h.server.runtime.store.get('leak-cancel-running')!.samples.some((s) => s.stage === 'run'), 'a sample of leak-cancel-running to run');
      session.cancel('leak-cancel-running');
      session.close();
      const trajectories = await collect(session.trajectories());

      const expected = tasks.reduce((n, t) => n + (t.numSamples ?? 1), 0);
      expect(trajectories).toHaveLength(expected);
      const statusOf = (taskId: string): TrajectoryStatus[] => trajectories.filter((t) => t.taskId === taskId).map((t) => t.status);
      // The early cancel may race a fast sample to the finish; either way nothing else may come out.
      for (const s of statusOf('leak-cancel-early')) expect(s === S.TRAJECTORY_STATUS_CANCELLED || OK.has(s)).toBe(true);
      expect(statusOf('leak-cancel-running')).toContain(S.TRAJECTORY_STATUS_CANCELLED);
      expect(statusOf('leak-init-timeout')).toEqual([S.TRAJECTORY_STATUS_TIMEOUT]);
      expect(statusOf('leak-run-timeout')).toEqual([S.TRAJECTORY_STATUS_TIMEOUT, S.TRAJECTORY_STATUS_TIMEOUT]);
      expect(statusOf('leak-backend-error')).toEqual([S.TRAJECTORY_STATUS_BACKEND_ERROR, S.TRAJECTORY_STATUS_BACKEND_ERROR]);
      for (const t of trajectories.filter((x) => x.taskId.startsWith('leak-ok-'))) expect(OK.has(t.status), name(t)).toBe(true);
      await eventually(async () => (await liveSandboxes()).length === 0, 'every sandbox to be removed', 5_000);
      expect(maxDirs).toBeGreaterThan(0);
    } finally {
      clearInterval(poll);
    }
  });

  it('after the server shuts down with samples still running', async () => {
    const h = await harness({ engine: { tokenLatencyMs: 100 } });
    await h.client.submit(mathTask('shutdown-inflight', 3, 901));
    await eventually(() => h.server.runtime.pipeline.stageStats().find((s) => s.stage === 'run')!.active === 3, 'three samples running');
    expect((await liveSandboxes()).length).toBe(3);
    await h.server.shutdown();
    await eventually(async () => (await liveSandboxes()).length === 0, 'the in-flight sandboxes to be stopped at shutdown', 5_000).catch(
      async (err: unknown) => {
        throw new Error(`${(err as Error).message}; left: ${(await liveSandboxes()).join(', ')}`);
      },
    );
  });
});
