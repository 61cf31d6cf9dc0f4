import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runHumanEvalTests } from '../../../src/environments/code/humaneval-runner.js';
import { validateCodeInstance, type HumanEvalTask } from '../../../src/environments/code/instance.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

// Review s39 (helper-85, code environment). The harness splits check's body into tests (statements holding an
// assert) and set-up (the rest); a set-up statement that fails fails the tests after it. A failing statement AFTER the
// last test failed nothing: `assert f(1, 2) == 3` then `_more_checks(f)` (asserts in a helper) gave `return 3` every
// test - reward 1 for a solution that check(candidate) itself rejects. Likewise a check run whole: `async def check`
// (which the instance schema accepts) or a check that yields returned a coroutine or generator without running its
// body, and every solution passed.

const signal = new AbortController().signal;
const task = (body: string) =>
  validateCodeInstance({
    prompt: 'def add(a, b):\n    """Sum of a and b."""\n',
    test: `def _more_checks(f):\n    assert f(5, 5) == 10\n    assert f(-1, 1) == 0\n\ndef check(f):\n${body}`,
    entry_point: 'add',
    timeout_s: 10,
  }) as HumanEvalTask;
const helperLast = task('    assert f(1, 2) == 3\n    _more_checks(f)\n');
const nestedHelper = task('    def helper(x, y, want):\n        assert f(x, y) == want\n    helper(1, 2, 3)\n    helper(5, 5, 10)\n');
const asyncCheck = task('    assert f(1, 2) == 3\n').test.replace('def check(f):', 'async def check(f):');
const generatorCheck = task('    assert f(1, 2) == 3\n    yield\n');
const loopLast = task('    assert f(1, 2) == 3\n    for a, b in [(5, 5), (7, 1)]:\n        _more_checks(f) if a == 5 else None\n    x = 1\n');

describe('HumanEval harness: every statement of check decides the verdict', () => {
  const driver = closeAfterAll(new BubblewrapDriver());
  let sandbox: Sandbox;
  beforeAll(async () => {
    sandbox = await driver.start(testSpec({ wallClockMs: 120_000 }));
  });
  afterAll(async () => {
    await sandbox?.stop();
  });

  it('a helper call after the last assert that fails fails the last test', async () => {
    const run = await runHumanEvalTests(sandbox, helperLast, '    return 3', signal);
    expect(run.tests.some((t) => !t.passed)).toBe(true);
    expect(run.tests.at(-1)).toMatchObject({ passed: false, status: 'failed', detail: expect.stringContaining('AssertionError') });
  }, 60_000);

  it('so does a loop over helper calls followed by more set-up', async () => {
    const run = await runHumanEvalTests(sandbox, loopLast, '    return 3', signal);
    expect(run.tests.every((t) => t.passed)).toBe(false);
  }, 60_000);

  it('a helper defined in check (its asserts make the def a test) and called after it', async () => {
    const run = await runHumanEvalTests(sandbox, nestedHelper, '    return 3', signal);
    expect(run.tests.every((t) => t.passed)).toBe(false);
  }, 60_000);

  it('an async check and a generator check run their body: they pass nothing they did not check', async () => {
    const asyncTask = { ...helperLast, test: asyncCheck };
    expect((await runHumanEvalTests(sandbox, asyncTask, '    return -1', signal)).tests.map((t) => t.passed)).toEqual([false]);
    expect((await runHumanEvalTests(sandbox, generatorCheck, '    return -1', signal)).tests.map((t) => t.passed)).toEqual([false]);
    expect((await runHumanEvalTests(sandbox, asyncTask, '    return a + b', signal)).tests.map((t) => t.passed)).toEqual([true]);
    expect((await runHumanEvalTests(sandbox, generatorCheck, '    return a + b', signal)).tests.map((t) => t.passed)).toEqual([true]);
  }, 60_000);

  it('a correct solution passes every test of both', async () => {
    for (const t of [helperLast, loopLast, nestedHelper]) {
      const run = await runHumanEvalTests(sandbox, t, '    return a + b', signal);
      expect(run.tests.every((x) => x.status === 'passed')).toBe(true);
    }
  }, 60_000);
});
