import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { createCodeEnvironment } from '../../../src/environments/code/code-environment.js';
import { runHumanEvalTests } from '../../../src/environments/code/humaneval-runner.js';
import { validateCodeInstance, type HumanEvalTask } from '../../../src/environments/code/instance.js';
import type { SandboxRequest } from '../../../src/sandboxes/spec.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

// Review s39 (helper-85, code environment). The HumanEval harness reports one JSON line per test on stdout, and the
// sandbox keeps only its output cap of it (64 KiB for HumanEval tasks): a task with ~900 or more asserting statements
// (well under the 1 MB a test may hold) cut a correct solution's later results off, and those tests were failed as
// "the program ended before this test ran (exit code 0)" - reward 0 for a correct solution, an infrastructure failure
// counted against the policy.

const driver = closeAfterAll(new BubblewrapDriver());
const started: Sandbox[] = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((s) => s.stop()));
});
afterAll(async () => {
  await driver.close?.();
});

/** The pipeline's openSandbox at its seam: the request's limits over the server's (here the test spec's) defaults. */
async function openSandbox(request?: SandboxRequest): Promise<Sandbox> {
  const sandbox = await driver.start(testSpec({ wallClockMs: 120_000, ...request?.limits }));
  started.push(sandbox);
  return sandbox;
}

const signal = new AbortController().signal;
const ASSERTS = 1500;
const row = {
  prompt: 'def add(a, b):\n    """Sum of a and b."""\n',
  test: `def check(f):\n${Array.from({ length: ASSERTS }, (_, i) => `    assert f(${i}, 1) == ${i + 1}`).join('\n')}\n`,
  entry_point: 'add',
  timeout_s: 60,
};
const code = createCodeEnvironment({ testBudgetMs: 60_000 });
const evaluate = (completion: string) =>
  code.evaluate({
    instance: code.validate(row),
    sandbox: undefined as unknown as Sandbox, // graded in the fresh sandbox openSandbox gives, never the episode's
    signal,
    openSandbox,
    outcome: { messages: [], finishAnswer: completion, finishReason: 'finish_tool' },
  });

describe('HumanEval grading: the harness output fits the grading sandbox whatever the number of tests', () => {
  it(`a correct solution of a task with ${ASSERTS} asserting statements gets reward 1`, async () => {
    const evaluation = await evaluate('    return a + b');
    expect(evaluation.details).toMatchObject({ passed: ASSERTS, total: ASSERTS });
    expect(evaluation.reward).toBe(1);
  }, 120_000);

  it('a wrong solution with a long unicode load error on every test is reward 0, never an evaluation failure', async () => {
    // Its exception text is repeated for every test in the harness's output: the solution must not be able to push
    // that output past the cap (with the cap treated as the environment's fault, that would trade reward 0 for an
    // ENVIRONMENT_ERROR the trainer drops).
    const evaluation = await evaluate(`    return a + b\nraise ValueError("\\u2028\\x00" * 400)`);
    expect(evaluation.reward).toBe(0);
    expect(evaluation.details).toMatchObject({ passed: 0, total: ASSERTS });
  }, 120_000);

  it("what the task's test code prints never crowds out the results, and the solution cannot size it", async () => {
    const printing = {
      ...row,
      test: 'def check(f):\n    print("#" * 200000)\n    assert f(1, 2) == 3\n    print(f("x", "y"))\n    assert f(2, 2) == 4\n',
    };
    const run = (completion: string) =>
      code.evaluate({
        instance: code.validate(printing),
        sandbox: undefined as unknown as Sandbox,
        signal,
        openSandbox,
        outcome: { messages: [], finishAnswer: completion, finishReason: 'finish_tool' },
      });
    expect((await run('    return a + b')).reward).toBe(1);
    // Wrong, and its value printed by the test is 2 MB: a failed test (reward 0), not an evaluation failure.
    const flood = await run('    return a * 1000000 + b if isinstance(a, str) else a - b');
    expect(flood.reward).toBe(0);
    expect(flood.details).toMatchObject({ passed: 0, total: 2 });
  }, 120_000);

  it('harness output cut by a sandbox cap that is too small is an environment_error, never failed tests', async () => {
    const task = validateCodeInstance(row) as HumanEvalTask;
    const sandbox = await openSandbox({ limits: { outputLimitBytes: 4096 } });
    await expect(runHumanEvalTests(sandbox, task, '    return a + b', signal)).rejects.toMatchObject({
      code: 'environment_error',
      message: expect.stringContaining('output limit'),
    });
  }, 120_000);
});
