import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { silentLogger } from '../../src/observability/logger.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import type { SandboxDriver } from '../../src/sandboxes/types.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { findMathVerify } from '../../src/environments/math/math-verify-checker.js';
import { defaultImagePath } from '../../src/sandboxes/images/image-recipe.js';
import { hermesToolCall, latestToolResponse, type FakePolicy } from '../../src/testing/scripted-policy.js';
import { collect, invariantViolations } from '../support/harness.js';
import { liveSandboxes, startServerHarness, type ServerHarness } from '../support/server-harness.js';

/**
 * Grading happens in a fresh sandbox from the image, not in the one the episode used. The scripted model (the fake
 * vLLM engine, a test double) first sabotages its own sandbox through the bash tool — it fills /tmp and its
 * workspace to their quotas with planted files and leaves a process running that SIGKILLs every python3 it sees —
 * and only then submits its answer. Graded in the episode's sandbox, that broke every check: the stdin/stdout
 * runner could not write the solution (ENVIRONMENT_ERROR), the HumanEval harness and math-verify were killed
 * (ENVIRONMENT_ERROR, or a correct solution scored 0). Graded in a fresh sandbox, the answer gets its true reward.
 */

const image = defaultImagePath();
const COMPLETED = TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED;

/** Kills every other python3 process of its sandbox, forever (its own PID namespace: it sees no other sandbox). */
const KILLER = [
  'import os, signal, time',
  'me = os.getpid()',
  'while True:',
  '    for p in os.listdir("/proc"):',
  '        if p.isdigit() and int(p) != me:',
  '            try:',
  '                if b"python3" in open("/proc/" + p + "/cmdline", "rb").read():',
  '                    os.kill(int(p), signal.SIGKILL)',
  '            except Exception:',
  '                pass',
  '    time.sleep(0.002)',
].join('\n');

const SABOTAGE = [
  'cat /dev/zero > /tmp/planted; cat /dev/zero > "$HOME/planted"',
  `nohup python3 -c '${KILLER}' > /dev/null 2>&1 < /dev/null &`,
  'sleep 0.5; kill -0 $! && echo "saboteur alive"',
].join('\n');

const SUM_RIGHT = 'a, b = map(int, input().split())\nprint(a + b)';
const SUM_WRONG = 'a, b = map(int, input().split())\nprint(a - b)';
const fence = (code: string) => `Here is my solution.\n\n\`\`\`python\n${code}\n\`\`\``;

/** The task's seed picks the script (seed / 1e6; the engine sees it offset per sample and turn). */
const SCRIPT = 1_000_000;

/** Script 1: the right answer; script 2: a wrong one. Every episode sabotages its sandbox first. */
const saboteur: FakePolicy = (prompt, ctx) => {
  if (latestToolResponse(prompt) === undefined) return hermesToolCall('bash', { command: SABOTAGE });
  const right = Math.floor(ctx.seed / SCRIPT) === 1;
  if (prompt.includes('print their sum')) return fence(right ? SUM_RIGHT : SUM_WRONG);
  if (prompt.includes('def add(')) return fence(right ? '    return a + b' : '    return a * b');
  return right ? 'So the sum is \\boxed{\\frac{3}{4}}.' : 'So the sum is \\boxed{0.7}.';
};

const stdio = { statement: 'Read two integers and print their sum.', tests: [{ input: '1 2\n', output: '3\n' }, { input: '10 -4\n', output: '6\n' }], time_limit_s: 2 };
const humanEval = {
  prompt: 'def add(a: int, b: int) -> int:\n    """The sum of a and b."""\n',
  test: 'def check(candidate):\n    assert candidate(2, 2) == 4\n    assert candidate(-1, 3) == 2\n',
  entry_point: 'add',
};
const mathInstance = { problem: 'What is 1/2 + 1/4?', answer: '\\frac{3}{4}', checker: 'math-verify' };

const task = (taskId: string, environment: string, instance: Record<string, unknown>, script: number): TaskInput => ({
  taskId,
  environment,
  numSamples: 1,
  instance,
  includeMessages: true,
  sampling: { temperature: 1, seed: script * SCRIPT, maxTokensPerTurn: 2048, maxTotalTokens: 16_384, stop: [] },
});

async function run(h: ServerHarness, tasks: TaskInput[]): Promise<Map<string, Trajectory>> {
  const session = h.client.openSession();
  await Promise.all(tasks.map((t) => session.submit(t)));
  session.close();
  const trajectories = await collect(session.trajectories());
  expect(trajectories).toHaveLength(tasks.length);
  for (const t of trajectories) {
    expect(invariantViolations(t)).toEqual([]);
    // The sabotage really happened in the episode's sandbox: both quotas full, the killer running.
    const observation = t.messages.find((m) => m.role === 'tool')?.content ?? '';
    expect(observation, t.taskId).toContain('No space left on device');
    expect(observation, t.taskId).toContain('saboteur alive');
  }
  return new Map(trajectories.map((t) => [t.taskId, t]));
}

describe.runIf(existsSync(image) || process.env.CI)('grading in a fresh sandbox, whatever the episode left in its own', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({ engine: { policy: saboteur }, config: { sandbox: { image, diskMb: 32 } } });
  });
  afterAll(async () => h?.close());

  it('code: stdin/stdout and HumanEval solutions get their true reward, COMPLETED', async () => {
    const results = await run(h, [task('io-right', 'code', stdio, 1), task('io-wrong', 'code', stdio, 2), task('he-right', 'code', humanEval, 1), task('he-wrong', 'code', humanEval, 2)]);
    const outcome = (id: string) => {
      const t = results.get(id)!;
      expect(t.status, `${id}: ${t.error}`).toBe(COMPLETED);
      return { reward: t.reward, statuses: (t.evalReport!.tests as { status: string }[]).map((x) => x.status) };
    };
    expect(outcome('io-right')).toEqual({ reward: 1, statuses: ['passed', 'passed'] });
    expect(outcome('io-wrong')).toEqual({ reward: 0, statuses: ['wrong_answer', 'wrong_answer'] });
    expect(outcome('he-right')).toEqual({ reward: 1, statuses: ['passed', 'passed'] });
    expect(outcome('he-wrong')).toEqual({ reward: 0, statuses: ['passed', 'failed'] });
    expect(await liveSandboxes()).toEqual([]);
  });

  it.runIf(findMathVerify() !== undefined || process.env.CI)('math: math-verify checks the answer, COMPLETED with its true reward', async () => {
    const results = await run(h, [task('mv-right', 'math', mathInstance, 1), task('mv-wrong', 'math', mathInstance, 2)]);
    for (const [id, reward] of [['mv-right', 1], ['mv-wrong', 0]] as const) {
      const t = results.get(id)!;
      expect(t.status, `${id}: ${t.error}`).toBe(COMPLETED);
      expect(t.reward, id).toBe(reward);
      expect(t.evalReport).toMatchObject({ checker: 'math-verify', comparison: 'math-verify' });
    }
    expect(await liveSandboxes()).toEqual([]);
  });
});

describe.runIf(existsSync(image) || process.env.CI)('a grading sandbox that cannot start', () => {
  let h: ServerHarness;
  const bwrap = new BubblewrapDriver({ logger: silentLogger() });
  beforeAll(async () => {
    // Every second sandbox fails to start: with one sample at a time, that is its grading sandbox.
    let starts = 0;
    const sandboxes: SandboxDriver = {
      name: 'every-second-fails',
      start: async (spec, signal) => (++starts % 2 === 0 ? Promise.reject(new RolloutError('sandbox_error', 'no room for another sandbox')) : bwrap.start(spec, signal)),
    };
    h = await startServerHarness({ engine: { policy: () => fence(SUM_RIGHT) }, sandboxes, config: { sandbox: { image } } });
  });
  afterAll(async () => {
    await h?.close();
    await bwrap.close?.();
  });

  it('is SANDBOX_ERROR, never reward 0', async () => {
    const session = h.client.openSession();
    await session.submit(task('io-no-grader', 'code', stdio, 1));
    session.close();
    const [t] = await collect(session.trajectories());
    expect(t).toMatchObject({ status: TrajectoryStatus.TRAJECTORY_STATUS_SANDBOX_ERROR, error: expect.stringContaining('no room for another sandbox') });
    expect(await liveSandboxes()).toEqual([]);
  });
});
