import { randomUUID } from 'node:crypto';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/observability/logger.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { Sandbox, SandboxDriver, SandboxSpec } from '../../src/sandboxes/types.js';
import { hermesToolCall } from '../../src/testing/scripted-policy.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { limits, liveSandboxes, startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';
import { findHostProcessesWithEnv, mountsMatching, processesInOurCgroups } from '../sandboxes/helpers.js';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

// A hung sandbox against a real server with real bubblewrap sandboxes: a tool command that ignores SIGTERM and
// sleeps, and a sandbox start that never returns (one that honours its abort signal, one that ignores it and
// starts a real sandbox late). Each sample ends TIMEOUT within its stage deadline — never a reward, never a hang —
// and the sandbox is gone afterwards: no process, cgroup or mount of it left on the host.
//
// Bounds: the stage deadline the task sets (2–3 s) plus 20 s of slack for sandbox start and teardown on a loaded
// 2-core box; asserted to catch a hang, not to time the server.

const SLACK_MS = 20_000;
const TAG = 'ROLLOUT_HUNG_TAG';
const name = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex} ${TrajectoryStatus[t.status]} ${t.error}`;

const harnesses: ServerHarness[] = [];
const roots: string[] = [];
afterEach(async () => {
  for (const h of harnesses.splice(0)) await h.close();
});
afterAll(async () => {
  for (const r of roots.splice(0)) await rm(r, { recursive: true, force: true });
});

async function runTask(h: ServerHarness, task: TaskInput, boundMs: number): Promise<{ trajectories: Trajectory[]; tookMs: number }> {
  const started = Date.now();
  const session = h.client.openSession();
  await session.submit(task);
  session.close();
  const trajectories = await within(collect(session.trajectories()), boundMs, `task ${task.taskId}`);
  return { trajectories, tookMs: Date.now() - started };
}

function expectTimeout(t: Trajectory, pattern: RegExp): void {
  expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_TIMEOUT');
  expect(t.reward).toBe(0);
  expect(t.rewardDetails).toEqual({});
  expect(t.error).toMatch(pattern);
  expect(invariantViolations(t)).toEqual([]);
}

/** Nothing of this process's sandboxes is left: cgroups, processes in them, tagged processes, stage mounts. */
async function expectNothingLeft(token?: string): Promise<void> {
  await eventually(async () => (await liveSandboxes()).length === 0, 'every sandbox cgroup to be removed', SLACK_MS);
  if (token) expect(findHostProcessesWithEnv(TAG, token)).toEqual([]);
  expect(processesInOurCgroups()).toEqual([]);
  expect(mountsMatching('rollout-stage')).toEqual([]);
}

describe('a hung sandbox ends TIMEOUT within the stage deadline, and is gone afterwards', () => {
  // The model's own stall is the policy's outcome (review s40): cut where the episode's tool-time budget ends (or just
  // before the run stage's deadline), TRUNCATED and evaluated — before, it ran into the run deadline and ended TIMEOUT.
  it('a tool command that ignores SIGTERM and sleeps (with a child doing the same): TRUNCATED at the tool-time budget', async () => {
    const token = randomUUID();
    const command = `export ${TAG}=${token}; trap '' TERM; (sleep 3600 &); sleep 3600`;
    const h = await startServerHarness({
      engine: { policy: (prompt) => (prompt.includes('<tool_response>') ? 'The answer is \\boxed{2}' : hermesToolCall('bash', { command })) },
    });
    harnesses.push(h);
    const runTimeoutMs = 4_000;
    const running = runTask(h, mathTask('hung-tool', 2, 1, { limits: limits({ runTimeoutMs }) }), runTimeoutMs + SLACK_MS);
    // The hung commands really run (two sleeps per sample, TERM ignored) until the sandbox is killed as a whole.
    let settled = false;
    void running.finally(() => (settled = true)).catch(() => undefined);
    let seen = 0;
    while (!settled) {
      seen = Math.max(seen, findHostProcessesWithEnv(TAG, token).filter((p) => commandOf(p.pid) === 'sleep').length);
      await new Promise((r) => setTimeout(r, 20));
    }
    const { trajectories, tookMs } = await running;
    expect(seen).toBe(4);
    expect(trajectories).toHaveLength(2);
    for (const t of trajectories) {
      expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_TRUNCATED');
      expect(t.finishReason).toBe('tool_time_budget');
      expect(invariantViolations(t)).toEqual([]);
    }
    expect(tookMs).toBeGreaterThanOrEqual(runTimeoutMs / 2);
    await expectNothingLeft(token);
  });

  it('a sandbox start that hangs but honours its signal: TIMEOUT at the init deadline, the engine never asked', async () => {
    const h = await startServerHarness({ sandboxes: new HangingStartDriver('honours-signal') });
    harnesses.push(h);
    const initTimeoutMs = 2_000;
    const { trajectories, tookMs } = await runTask(h, mathTask('hung-start', 2, 2, { limits: limits({ initTimeoutMs }) }), initTimeoutMs + SLACK_MS);
    for (const t of trajectories) expectTimeout(t, new RegExp(`init stage timed out after ${initTimeoutMs} ms`));
    expect(tookMs).toBeGreaterThanOrEqual(initTimeoutMs);
    expect(h.engine.stats().received).toBe(0);
  });

  it('a sandbox start that ignores its signal and returns a real sandbox late: TIMEOUT at the init deadline, the late sandbox stopped', async () => {
    const root = await mkdtemp(join(tmpdir(), 'rollout-test-root-'));
    roots.push(root);
    const driver = new HangingStartDriver('late', new BubblewrapDriver({ logger: silentLogger(), tmpRoot: root }), 4_000);
    const h = await startServerHarness({ sandboxes: driver });
    harnesses.push(h);
    const initTimeoutMs = 1_500;
    const { trajectories } = await runTask(h, mathTask('late-start', 2, 3, { limits: limits({ initTimeoutMs }) }), initTimeoutMs + SLACK_MS);
    for (const t of trajectories) expectTimeout(t, new RegExp(`init stage timed out after ${initTimeoutMs} ms`));
    // Not waiting for the late starts: the samples end at their deadline.
    expect(driver.lateStarts).toBe(0);
    // The starts finish after the samples gave up on them: each late sandbox must still be stopped.
    await eventually(() => driver.lateStarts === 2, 'both late starts to finish', 4_000 + SLACK_MS);
    await expectNothingLeft();
    expect(driver.lateSandboxes.every((s) => s.stopped)).toBe(true);
  });
});

/** The program a host process runs (argv[0]), or '' once it is gone. */
function commandOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0] ?? '';
  } catch {
    return '';
  }
}

/**
 * TEST DOUBLE: a sandbox driver whose start hangs. 'honours-signal': never resolves, rejects with the signal's
 * reason when it fires. 'late': ignores the signal, waits `lateMs`, then starts a real sandbox with `inner` and
 * returns it (a driver stuck in a slow image pull that does not listen to cancellation).
 */
class HangingStartDriver implements SandboxDriver {
  readonly name = 'hanging-start (test double)';
  lateStarts = 0;
  readonly lateSandboxes: Array<{ sandbox: Sandbox; stopped: boolean }> = [];

  constructor(
    private readonly mode: 'honours-signal' | 'late',
    private readonly inner?: SandboxDriver,
    private readonly lateMs = 0,
  ) {}

  start(spec: SandboxSpec, signal?: AbortSignal): Promise<Sandbox> {
    if (this.mode === 'honours-signal') {
      return new Promise((_, reject) => signal?.addEventListener('abort', () => reject(signal.reason as Error), { once: true }));
    }
    return (async () => {
      await new Promise((r) => setTimeout(r, this.lateMs));
      const sandbox = await this.inner!.start(spec);
      const entry = { sandbox, stopped: false };
      const stop = sandbox.stop.bind(sandbox);
      sandbox.stop = async () => {
        entry.stopped = true;
        await stop();
      };
      this.lateSandboxes.push(entry);
      this.lateStarts++;
      return sandbox;
    })();
  }
}
