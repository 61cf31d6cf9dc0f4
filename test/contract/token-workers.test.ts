import { stat } from 'node:fs/promises';
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { calcPolicy, CALC_ENVIRONMENT, createCalcEnvironment } from '../../src/testing/calc-environment.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { hermesToolCall } from '../../src/testing/scripted-policy.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

const harnesses: ServerHarness[] = [];
afterEach(async () => {
  for (const h of harnesses.splice(0)) await h.close();
});

/** OS threads of this process (Linux). */
function threads(): number {
  return Number(/^Threads:\s+(\d+)$/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1]);
}

/**
 * A server whose token work all goes to one token thread (inlineMaxChars 0), on the calc environment (in-process
 * tool, null sandboxes). Its engine's policy answers like calcPolicy, except that the problem "What is 6 * 7?"
 * gets a tool call naming CRASH-THE-TOKEN-WORKER, on which the TEST DOUBLE worker script ends its thread.
 */
async function server(): Promise<ServerHarness> {
  const h = await startServerHarness({
    registry: defaultRegistry().register(createCalcEnvironment()),
    sandboxes: new NullSandboxDriver(),
    config: { tokenWorkers: { count: 1, inlineMaxChars: 0 } },
    tokenWorkerScript: new URL('../support/crashing-token-worker.mjs', import.meta.url),
    engine: {
      policy: (prompt, ctx) =>
        prompt.includes('What is 6 * 7?') && !prompt.includes('<tool_response>') ? hermesToolCall('calc', { expression: 'CRASH-THE-TOKEN-WORKER' }) : calcPolicy(prompt, ctx),
    },
  });
  harnesses.push(h);
  return h;
}

function task(taskId: string, problem: string, numSamples = 1): TaskInput {
  return {
    taskId,
    environment: CALC_ENVIRONMENT,
    numSamples,
    instance: { problem, answer: '0' },
    sampling: { temperature: 1, seed: 1, maxTokensPerTurn: 256, maxTotalTokens: 8192, stop: [] },
  };
}

async function run(h: ServerHarness, tasks: TaskInput[]): Promise<Trajectory[]> {
  const session = h.client.openSession();
  for (const t of tasks) await session.submit(t);
  session.close();
  return collect(session.trajectories());
}

describe('token threads in a server', () => {
  it('render and tokenize every turn, and a thread that crashes fails only the sample it was working on', async () => {
    const h = await server();
    const trajectories = await run(h, [task('ok-a', 'What is 2 + 3?', 2), task('doomed', 'What is 6 * 7?'), task('ok-b', 'What is 4 * 4?')]);
    const byTask = (id: string): Trajectory[] => trajectories.filter((t) => t.taskId === id);
    for (const t of [...byTask('ok-a'), ...byTask('ok-b')]) {
      expect(t.status, t.error).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
      expect(t.numTurns).toBe(2);
      expect(invariantViolations(t)).toEqual([]);
    }
    const [doomed] = byTask('doomed');
    // An infrastructure failure, never a COMPLETED trajectory with reward 0.
    expect(doomed!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR);
    expect(doomed!.error).toMatch(/^internal: token worker exited with code 7 while working on this sample; the pool replaced it/);
    expect(h.server.tokenPool!.stats()).toMatchObject({ workers: 1, crashes: 1 });
    // The replacement thread serves the next task.
    const [after] = await run(h, [task('after', 'What is 1 + 1?')]);
    expect(after!.status, after!.error).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
  });

  it('are shut down with the server: none outlives it', async () => {
    // libuv starts its thread pool on its first use; make sure that happened before counting, or a first use during
    // the server's life reads as four threads outliving it (a CI run failed this way).
    await stat('/');
    const before = threads();
    const h = await server();
    await run(h, [task('one', 'What is 2 + 2?')]);
    const pool = h.server.tokenPool!;
    expect(pool.stats().workers).toBe(1);
    expect(pool.stats().completed).toBeGreaterThan(0);
    await h.close();
    expect(pool.stats()).toMatchObject({ workers: 0, busy: 0, queued: 0 });
    // A terminated worker's OS thread is reaped just after its exit event: allowed a moment, not forever.
    await expect.poll(() => threads(), { timeout: 5_000 }).toBeLessThanOrEqual(before);
  });
});

describe('deadlines and pool settings from the config file', () => {
  it('reach the token threads and the backend pool (defaults: 60 s, 1 s; engines held after an outage, 8 busy retries from 250 ms)', async () => {
    const h = await startServerHarness({
      sandboxes: new NullSandboxDriver(),
      config: { tokenWorkers: { count: 1, taskTimeoutMs: 5_000, abandonedTaskGraceMs: 200 }, backendHoldRecovered: false, backendMaxBusyRetries: 2, backendBusyBackoffMs: 40 },
    });
    harnesses.push(h);
    expect(h.server.tokenPool!.deadlines).toEqual({ taskTimeoutMs: 5_000, abandonedTaskGraceMs: 200 });
    expect(h.server.runtime.deps.pool.settings).toMatchObject({ holdRecoveredBackends: false, maxBusyRetries: 2, busyBackoffMs: 40 });
    const d = await startServerHarness({ sandboxes: new NullSandboxDriver(), config: { tokenWorkers: { count: 1 } } });
    harnesses.push(d);
    expect(d.server.tokenPool!.deadlines).toEqual({ taskTimeoutMs: 60_000, abandonedTaskGraceMs: 1_000 });
    expect(d.server.runtime.deps.pool.settings).toMatchObject({ holdRecoveredBackends: true, maxBusyRetries: 8, busyBackoffMs: 250 });
  });

  it('are refused past what a timer can wait, naming the field', async () => {
    await expect(startServerHarness({ sandboxes: new NullSandboxDriver(), config: { tokenWorkers: { taskTimeoutMs: 2 ** 31 } } })).rejects.toMatchObject({
      code: 'invalid_argument',
      message: expect.stringContaining('tokenWorkers.taskTimeoutMs'),
    });
  });
});
