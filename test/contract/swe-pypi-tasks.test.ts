import { status, type ServiceError } from '@grpc/grpc-js';
import { readdir } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Role, ToolOutcome, TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { buildTaskImage, DEFAULT_SWE_CACHE_DIR } from '../../src/environments/swe/pypi-tasks/build-task-image.js';
import { loadSweTasks, sweTaskInstance, type SweTask } from '../../src/environments/swe/pypi-tasks/task-definition.js';
import type { FakePolicy } from '../../src/testing/scripted-policy.js';
import { createScriptedSwePolicy, editsFromPatch } from '../../src/testing/scripted-swe-policy.js';
import { collect, invariantViolations } from '../support/harness.js';
import { limits, liveSandboxes, startServerHarness, type ServerHarness } from '../support/server-harness.js';

/** Where the swe environment puts the working copy of /testbed: the sandbox workspace (config default /work). */
const REPO = '/work/testbed';
/** The variant a sample plays, chosen by its task's seed (the engine sees taskSeed + 1000·sample + turn). */
const VARIANTS = ['gold', 'unchanged', 'breaks-pass-to-pass'] as const;
type Variant = (typeof VARIANTS)[number];
const SEED_STRIDE = 100_000;

/**
 * The five SWE tasks built from PyPI sdists (tasks/swe), end to end through the real server, the fake vLLM engine
 * (test double) and real bubblewrap sandboxes on the tasks' .sif images, each played by three scripted policies:
 * the upstream fix through str_replace_editor (reward 1), no change (0), the fix plus an edit that breaks a
 * PASS_TO_PASS test (0). Images are built here (cached by content hash; the first build needs root and the
 * registries: Debian for the base, PyPI for the sdists), as in CI.
 */
describe.runIf(process.getuid?.() === 0 || process.env.CI)('SWE tasks from PyPI sdists, scored through the server', () => {
  let h: ServerHarness;
  let tasks: SweTask[];
  const images = new Map<string, string>();

  beforeAll(async () => {
    tasks = await loadSweTasks();
    for (const task of tasks) images.set(task.id, (await buildTaskImage(task)).path);
    h = await startServerHarness({ engine: { policy: routerPolicy(tasks) }, config: { eval: { concurrency: 4 } } });
  }, 600_000);
  afterAll(async () => h?.close());

  it('defines at least five tasks from distinct projects', () => {
    expect(tasks.length).toBeGreaterThanOrEqual(5);
    expect(new Set(tasks.map((t) => t.project)).size).toBe(tasks.length);
  });

  it('rewards the upstream fix 1, no change 0, and the fix that breaks a PASS_TO_PASS test 0, on every task', async () => {
    const session = h.client.openSession();
    for (const task of tasks) {
      for (const [v, variant] of VARIANTS.entries()) await session.submit(sweTask(task, images.get(task.id)!, variant, v * SEED_STRIDE));
    }
    session.close();
    const trajectories = await collect(session.trajectories());
    expect(trajectories).toHaveLength(tasks.length * VARIANTS.length);
    for (const t of trajectories) {
      const task = tasks.find((x) => t.taskId.startsWith(`${x.id}/`))!;
      const variant = t.taskId.slice(task.id.length + 1) as Variant;
      const report = t.evalReport as Record<string, unknown>;
      const what = `${t.taskId}: ${t.error} ${JSON.stringify(report?.FAIL_TO_PASS)} ${JSON.stringify(report?.PASS_TO_PASS)} ${String(report?.test_output_tail).slice(-1500)}`;
      expect(t.status, what).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
      expect(invariantViolations(t)).toEqual([]);
      expect(t.rewardDetails.applied, what).toBe(1);
      expect(t.finishReason).toBe('finish_tool');
      expectToolsUsed(t, variant === 'unchanged' ? ['bash'] : ['bash', 'str_replace_editor']);
      const f2p = report.FAIL_TO_PASS as { statuses: Record<string, string> };
      const p2p = report.PASS_TO_PASS as { statuses: Record<string, string> };
      expect(Object.keys(f2p.statuses).sort()).toEqual([...task.FAIL_TO_PASS].sort());
      expect(Object.keys(p2p.statuses).sort()).toEqual([...task.PASS_TO_PASS].sort());
      switch (variant) {
        case 'gold':
          expect(t.reward, what).toBe(1);
          expect(t.rewardDetails).toEqual({ fail_to_pass: 1, pass_to_pass: 1, applied: 1, tests_timed_out: 0 });
          // The agent's diff is the upstream fix, line for line.
          for (const line of task.fixPatch.split('\n').filter((l) => /^[+-][^+-]/.test(l))) expect(report.patch).toContain(line);
          break;
        case 'unchanged':
          expect(t.reward, what).toBe(0);
          expect(t.rewardDetails).toEqual({ fail_to_pass: 0, pass_to_pass: 1, applied: 1, tests_timed_out: 0 });
          expect(report.patch).toBe('');
          expect(Object.values(f2p.statuses).every((s) => s === 'failed'), what).toBe(true);
          break;
        case 'breaks-pass-to-pass':
          expect(t.reward, what).toBe(0);
          expect(t.rewardDetails.fail_to_pass, what).toBe(1);
          expect(t.rewardDetails.pass_to_pass, what).toBeLessThan(1);
          expect(Object.values(p2p.statuses), what).toContain('failed');
          break;
      }
    }
    expect(await liveSandboxes()).toEqual([]);
  }, 600_000);

  it('refuses to build a task whose patches do not fit its sdist, and leaves no work dir behind', async () => {
    const task = tasks[0]!;
    const wrong = { ...task, fixPatch: task.fixPatch.replace(/^\+([^+].*)$/m, '+$1  # not upstream') };
    await expect(buildTaskImage(wrong)).rejects.toMatchObject({ code: 'failed_precondition', message: expect.stringContaining('do not reverse-apply') });
    expect((await readdir(DEFAULT_SWE_CACHE_DIR)).filter((name) => name.startsWith('.build-'))).toEqual([]);
  });

  it('lists swe with its instance schema and tools', async () => {
    const { environments } = await h.client.listEnvironments();
    const swe = environments.find((e) => e.name === 'swe');
    expect(swe?.tools).toEqual(['bash', 'str_replace_editor', 'finish']);
    expect(swe?.instanceSchema).toMatchObject({ type: 'object', required: expect.arrayContaining(['problem_statement', 'FAIL_TO_PASS']) });
  });

  it('rejects a bad instance naming the field, refuses an image missing at submit and reports an eval that cannot run as ENVIRONMENT_ERROR, never reward 0', async () => {
    const task = tasks[0]!;
    const good = sweTask(task, images.get(task.id)!, 'gold', 0);
    const bad = (await h.client.submit({ ...good, taskId: 'swe-bad', instance: { ...good.instance, FAIL_TO_PASS: [] } }).catch((e: unknown) => e)) as ServiceError;
    expect(bad.code).toBe(status.INVALID_ARGUMENT);
    expect(bad.metadata.get('rollout-field')).toEqual(['task.instance.FAIL_TO_PASS']);

    // Outside sandbox.imageDirs, a missing path is refused as any other path there is (helper-44: the answer must not
    // tell whether a path exists on the server); inside them, a missing image is refused too (a typo, not infrastructure).
    const outside = (await h.client.submit({ ...good, taskId: 'swe-outside', instance: { ...good.instance, image: '/nonexistent/task.sif' } }).catch((e: unknown) => e)) as ServiceError;
    expect(outside.code).toBe(status.INVALID_ARGUMENT);
    expect(outside.details).toContain('the image /nonexistent/task.sif is not inside an allowed directory');
    const missing = join(dirname(images.get(task.id)!), 'swe-nonexistent-task.sif');
    const noImage = (await h.client.submit({ ...good, taskId: 'swe-no-image', instance: { ...good.instance, image: missing } }).catch((e: unknown) => e)) as ServiceError;
    expect(noImage.code).toBe(status.INVALID_ARGUMENT);
    expect(noImage.details).toContain(`the image ${missing} does not exist on this server`);
    await h.client.submit({ ...good, taskId: 'swe-no-pytest', instance: { ...good.instance, test_command: 'exit 127' } });
    const [noPytest] = (await h.client.getTrajectory('swe-no-pytest', { wait: true })).trajectories;
    expect(noPytest!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR);
    expect(noPytest!.error).toContain('did not start pytest');
    expect(noPytest!.reward).toBe(0); // not a score: the status says the trajectory is not to be trained on
    expect(await liveSandboxes()).toEqual([]);
  }, 300_000);
});

function sweTask(task: SweTask, image: string, variant: Variant, seed: number): TaskInput {
  return {
    taskId: `${task.id}/${variant}`,
    environment: 'swe',
    numSamples: 1,
    instance: sweTaskInstance(task, image),
    sampling: { temperature: 1, seed, maxTokensPerTurn: 2048, maxTotalTokens: 32_768, stop: [] },
    limits: limits({ maxTurns: 10, evalTimeoutMs: 240_000, totalTimeoutMs: 480_000 }),
  };
}

/** Finds the task by its problem statement in the prompt and the variant by the seed, and plays that script. */
function routerPolicy(tasks: readonly SweTask[]): FakePolicy {
  const scripts = tasks.map((task) => {
    const fix = editsFromPatch(task.fixPatch, REPO);
    const breaking = { ...task.break_pass_to_pass, path: `${REPO}/${task.break_pass_to_pass.path}` };
    return {
      marker: task.problem_statement.split('\n')[0]!,
      policies: { gold: createScriptedSwePolicy(fix), unchanged: createScriptedSwePolicy([]), 'breaks-pass-to-pass': createScriptedSwePolicy([...fix, breaking]) },
    };
  });
  return (prompt, ctx) => {
    const script = scripts.find((s) => prompt.includes(s.marker));
    if (!script) return 'I do not know this task.';
    const variant = VARIANTS[Math.floor(ctx.seed / SEED_STRIDE)]!;
    return script.policies[variant](prompt, ctx);
  };
}

function expectToolsUsed(t: Trajectory, expected: string[]): void {
  const used = t.turns.filter((turn) => turn.role === Role.ROLE_TOOL).map((turn) => turn.toolName);
  expect([...new Set(used)].sort()).toEqual([...expected].sort());
  // Every tool call succeeded: a str_replace that missed would leave the task unsolved for the wrong reason.
  expect(t.turns.filter((turn) => turn.role === Role.ROLE_TOOL).map((turn) => turn.toolOutcome)).toEqual(used.map(() => ToolOutcome.TOOL_OUTCOME_OK));
}
