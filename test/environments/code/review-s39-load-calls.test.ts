import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runHumanEvalTests } from '../../../src/environments/code/humaneval-runner.js';
import { validateCodeInstance, type HumanEvalTask } from '../../../src/environments/code/instance.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

// Review s39 (helper-85, code environment). Many exports of HumanEval-format sets (HumanEval-X, MultiPL-E, MBPP
// conversions) end their test code with a call: `check(add)`, or `def test_check(): check(add)` then `test_check()`.
// The judge loaded the test code with the entry point bound to the solution, so that call ran the solution while
// the test code was loading: any wrong answer (or a deliberate raise) was "the task's test code did not load", an
// ENVIRONMENT_ERROR the trainer drops, never reward 0.

const signal = new AbortController().signal;
const task = (test: string) =>
  validateCodeInstance({ prompt: 'def add(a, b):\n    """Sum of a and b."""\n', test, entry_point: 'add', timeout_s: 10 }) as HumanEvalTask;
const CHECK = 'def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n';
const calledAtTheEnd = task(`${CHECK}\ncheck(add)\n`);
const multiPlE = task(`from __future__ import annotations\n\n${CHECK}\ndef test_check():\n    check(add)\n\ntest_check()\n`);

describe('HumanEval harness: test code that calls check itself when it loads', () => {
  const driver = closeAfterAll(new BubblewrapDriver());
  let sandbox: Sandbox;
  beforeAll(async () => {
    sandbox = await driver.start(testSpec({ wallClockMs: 120_000 }));
  });
  afterAll(async () => {
    await sandbox?.stop();
  });

  for (const [name, t] of [['check(add) at the end', calledAtTheEnd], ['test_check() at the end (MultiPL-E)', multiPlE]] as const) {
    it(`${name}: a wrong solution fails its tests (reward 0), a correct one passes them`, async () => {
      const wrong = await runHumanEvalTests(sandbox, t, '    return a - b', signal);
      expect(wrong.tests.map((x) => x.status)).toEqual(['failed', 'failed']);
      const exiting = await runHumanEvalTests(sandbox, t, '    raise SystemExit(0)', signal);
      expect(exiting.tests.some((x) => x.passed)).toBe(false);
      const right = await runHumanEvalTests(sandbox, t, '    return a + b', signal);
      expect(right.tests.map((x) => x.status)).toEqual(['passed', 'passed']);
    }, 60_000);
  }

  it('test code that fails to load by itself is still the task\'s fault (environment_error)', async () => {
    await expect(runHumanEvalTests(sandbox, task(`${CHECK}\nundefined_name()\n`), '    return a + b', signal)).rejects.toMatchObject({
      code: 'environment_error',
      message: expect.stringContaining("the task's test code did not load: NameError"),
    });
  }, 60_000);
});
