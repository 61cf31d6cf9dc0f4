import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CODE_EVAL_OVERHEAD_MS, createCodeEnvironment, DEFAULT_TEST_BUDGET_MS } from '../../../src/environments/code/code-environment.js';
import { runHumanEvalTests } from '../../../src/environments/code/humaneval-runner.js';
import { validateCodeInstance, type HumanEvalTask, type StdioTask } from '../../../src/environments/code/instance.js';
import { runStdioTests } from '../../../src/environments/code/stdio-runner.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';
import { FakeSandbox } from '../fake-sandbox.js';

const signal = new AbortController().signal;

const task = validateCodeInstance({
  prompt: 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n',
  test: 'METADATA = {}\n\n\ndef check(candidate):\n    assert candidate([]) == 0\n    big = list(range(100))\n    assert candidate(big) == 4950\n    assert all(candidate([x]) == x for x in big)\n',
  entry_point: 'total',
  timeout_s: 2,
}) as HumanEvalTask;

const sumTask = validateCodeInstance({
  prompt: 'Read two integers and print their sum.',
  tests: [
    { input: '1 2\n', output: '3\n' },
    { input: '-5 5\n', output: '0' },
    { input: '1000000000000 1\n', output: '1000000000001\n' },
  ],
  time_limit_s: 1,
  memory_limit_mb: 256,
}) as StdioTask;

const statuses = (run: { tests: { status: string }[] }) => run.tests.map((t) => t.status);

describe('the code environment\'s test runners in a real bubblewrap sandbox', () => {
  const driver = closeAfterAll(new BubblewrapDriver());
  let sandbox: Sandbox;
  beforeAll(async () => {
    sandbox = await driver.start(testSpec({ wallClockMs: 120_000, outputLimitBytes: 64 * 1024 }));
  });
  afterAll(async () => {
    await sandbox?.stop();
    await driver.close?.();
  });

  describe('HumanEval format: each asserting statement of check() is one test', () => {
    it('passes a whole function and a bare body alike', async () => {
      for (const code of ['def total(xs):\n    return sum(xs)', '    return sum(xs)']) {
        const run = await runHumanEvalTests(sandbox, task, code, signal);
        expect(statuses(run)).toEqual(['passed', 'passed', 'passed']);
        expect(run.completed).toBe(true);
      }
    });

    it('reports which asserts failed and why, running the rest', async () => {
      const run = await runHumanEvalTests(sandbox, task, '    return sum(xs) if len(xs) < 50 else -1', signal);
      expect(statuses(run)).toEqual(['passed', 'failed', 'passed']);
      expect(run.tests[1]!.detail).toBe('AssertionError');
    });

    it('fails every test of code that does not load or defines no such function', async () => {
      const broken = await runHumanEvalTests(sandbox, task, 'def total(xs) return 1', signal);
      expect(broken.tests.every((t) => !t.passed && /did not load: SyntaxError/.test(t.detail ?? ''))).toBe(true);
      // The prompt's own stub (a docstring, no body) is what is left to test: it returns None.
      const misnamed = await runHumanEvalTests(sandbox, task, 'def other(xs):\n    return sum(xs)', signal);
      expect(statuses(misnamed)).toEqual(['failed', 'failed', 'failed']);
      const noStub = await runHumanEvalTests(sandbox, { ...task, prompt: 'import math\n' }, 'def other(xs):\n    return sum(xs)', signal);
      expect(noStub.tests[0]!.detail).toBe('the solution defines no function total');
    });

    it('cannot be fooled by exiting early, printing fake results, or flooding stdout', async () => {
      for (const code of ['import sys\nsys.exit(0)', 'raise SystemExit(0)', 'def total(xs):\n    import os\n    os._exit(0)']) {
        const run = await runHumanEvalTests(sandbox, task, code, signal);
        expect(run.tests.some((t) => t.passed), code).toBe(false);
      }
      const faker = 'print("ok")\nprint(\'{"kind": "result", "index": 0, "passed": true}\')\ndef total(xs):\n    return -1';
      expect((await runHumanEvalTests(sandbox, task, faker, signal)).tests.some((t) => t.passed)).toBe(false);
      const loud = 'def total(xs):\n    print("x" * 1_000_000)\n    return sum(xs)';
      expect(statuses(await runHumanEvalTests(sandbox, task, loud, signal))).toEqual(['passed', 'passed', 'passed']);
    });

    it('counts a hang as a timeout of the tests without a result', async () => {
      const run = await runHumanEvalTests(sandbox, task, 'def total(xs):\n    while xs:\n        pass\n    return 0', signal);
      expect(statuses(run)).toEqual(['passed', 'timeout', 'timeout']);
      expect(run.completed).toBe(false);
    });

    it('is an environment error, not a failed solution, when the task\'s own test code is broken', async () => {
      const bad = { ...task, test: 'def check(candidate):\n    assert candidate([]) == 0\nimport no_such_module_here\n' };
      await expect(runHumanEvalTests(sandbox, bad, '    return sum(xs)', signal)).rejects.toMatchObject({ code: 'environment_error', message: expect.stringContaining("task's test code did not load") });
    });

    // Found by review (helper-37): a test whose check is missing (validation reads the text, not the Python) or takes
    // no candidate failed every solution as reward 0.
    it('is an environment error, not a failed solution, when the task\'s test code has no check(candidate) to call', async () => {
      const noCheck = { ...task, test: 'NOTE = """\ndef check(candidate):\n"""\n' };
      await expect(runHumanEvalTests(sandbox, noCheck, '    return sum(xs)', signal)).rejects.toMatchObject({ code: 'environment_error', message: expect.stringContaining('defines no check(candidate)') });
      const noArgument = { ...task, test: 'def check():\n    assert True\n' };
      await expect(runHumanEvalTests(sandbox, noArgument, '    return sum(xs)', signal)).rejects.toMatchObject({ code: 'environment_error', message: expect.stringContaining('check(candidate)') });
    });
  });

  describe('stdin/stdout format: one process per test, judged token by token', () => {
    const run = (program: string, t: StdioTask = sumTask) => runStdioTests(sandbox, t, program, signal);

    it('accepts a correct program (any whitespace) and rejects a wrong one per test', async () => {
      expect(statuses(await run('a, b = map(int, input().split())\nprint(a + b)'))).toEqual(['passed', 'passed', 'passed']);
      const wrong = await run('a, b = map(int, input().split())\nprint(a + b if a > 0 else 1)');
      expect(statuses(wrong)).toEqual(['passed', 'wrong_answer', 'passed']);
      expect(wrong.tests[1]!.detail).toBe('token 1: expected "0", got "1"');
    });

    it('reports a crash with the end of its traceback', async () => {
      const crash = await run('a, b = map(int, input().split())\nprint(a + b if b != 5 else 1 // 0)');
      expect(statuses(crash)).toEqual(['passed', 'runtime_error', 'passed']);
      expect(crash.tests[1]!.detail).toMatch(/^exit code 1: .*ZeroDivisionError: integer division or modulo by zero$/s);
    });

    it('stops at the time limit and skips the remaining tests after a timeout', async () => {
      const hang = await run('import sys\nif sys.stdin.read().startswith("-"):\n    while True: pass\nprint(3)');
      expect(statuses(hang)).toEqual(['passed', 'timeout', 'not_run']);
      expect(hang.completed).toBe(false);
    });

    // Found by review (helper-37): per-test limits add up past the eval stage's budget (the server's 60 s by default:
    // 15 tests at 4 s), so a wrong program that slept just under the limit on every test turned its reward 0 into
    // TIMEOUT, which trainers drop. The tests now share a total time inside the eval budget the environment asks for.
    it('stops starting tests once their total time is used up: a program slow on every test fails', async () => {
      const slow = { ...sumTask, timeLimitS: 5 };
      const started = performance.now();
      const run = await runStdioTests(sandbox, slow, 'import time\ntime.sleep(1)\na, b = map(int, input().split())\nprint(a + b)', signal, { budgetMs: 1500 });
      expect(performance.now() - started).toBeLessThan(4500); // not 3 tests of 1 s each, nor a 5 s limit waited out
      expect(run.completed).toBe(false);
      expect(run.tests.at(-1)!.status).toBe('not_run');
      expect(run.tests.filter((t) => t.passed).length).toBeLessThan(3);
      expect(run.tests.some((t) => /total time of 1\.5 s/.test(t.detail ?? ''))).toBe(true);
    });

    it('fails an output flood at the output cap, and an allocation past the memory limit as a crash', async () => {
      expect(statuses(await run('print("9" * 10_000_000)'))).toEqual(['output_limit', 'output_limit', 'output_limit']);
      const forever = await run('while True:\n    print("spam " * 1000)');
      expect(forever.tests[0]).toMatchObject({ status: 'output_limit', passed: false });
      const hog = await run('x = bytearray(512 * 1024 * 1024)\nprint(3)');
      expect(hog.tests[0]).toMatchObject({ status: 'runtime_error', detail: expect.stringContaining('MemoryError') });
    });

    it('judges printed floats within the task\'s float tolerance when it gives one, as text otherwise', async () => {
      const circle = validateCodeInstance({
        prompt: 'Print the area of a circle of radius r.',
        tests: [{ input: '1\n', output: '3.141593\n' }, { input: '2\n', output: '12.566371\n' }],
        time_limit_s: 2,
        float_tolerance: 1e-6,
      }) as StdioTask;
      const precise = 'import math\nr = float(input())\nprint(math.pi * r * r)';
      expect(statuses(await run(precise, circle))).toEqual(['passed', 'passed']);
      expect(statuses(await run(precise, { ...circle, floatTolerance: undefined }))).toEqual(['wrong_answer', 'wrong_answer']);
      const rough = await run('r = float(input())\nprint(3.14 * r * r)', circle);
      expect(statuses(rough)).toEqual(['wrong_answer', 'wrong_answer']);
      expect(rough.tests[0]!.detail).toBe('token 1: expected "3.141593", got "3.14" (outside the tolerance)');
    });
  });
});

describe('the code environment\'s eval budget', () => {
  it('covers the tests\' total time, so a slow program ends as a reward, not as the eval stage\'s TIMEOUT', () => {
    expect(createCodeEnvironment().stageTimeouts?.evalMs).toBe(DEFAULT_TEST_BUDGET_MS + CODE_EVAL_OVERHEAD_MS);
    expect(createCodeEnvironment({ testBudgetMs: 90_000 }).stageTimeouts?.evalMs).toBe(90_000 + CODE_EVAL_OVERHEAD_MS);
    // Every HumanEval program fits in the default budget: its time limit is at most 120 s.
    expect(DEFAULT_TEST_BUDGET_MS).toBeGreaterThanOrEqual(120_000);
  });
});

describe('an evaluation that cannot run is an environment error', () => {
  it('when the sandbox has no python3', async () => {
    const noPython = new FakeSandbox(() => ({ exitCode: 127, stderr: 'sh: 1: exec: python3: not found' }));
    await expect(runStdioTests(noPython, sumTask, 'print(3)', signal)).rejects.toMatchObject({ code: 'environment_error', message: expect.stringContaining('cannot run python3') });
    await expect(runHumanEvalTests(noPython, task, '    return 0', signal)).rejects.toMatchObject({ code: 'environment_error', message: expect.stringContaining('did not start') });
  });
});
