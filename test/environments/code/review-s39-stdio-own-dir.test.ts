import { afterEach, describe, expect, it } from 'vitest';
import { runStdioTests } from '../../../src/environments/code/stdio-runner.js';
import { validateCodeInstance, type StdioTask } from '../../../src/environments/code/instance.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

// Review s39 (helper-85, code environment). Each stdin/stdout test runs with the solution's fresh directory as its
// working directory, and the program runs as the directory's owner: a wrong program that removed or locked that
// directory during test 1 made every later exec fail with invalid_argument (field cwd), which the runner rethrew -
// the evaluation failed instead of the program's reward 0.

const driver = closeAfterAll(new BubblewrapDriver());
const started: Sandbox[] = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((s) => s.stop()));
});

const task = validateCodeInstance({
  prompt: 'Print the input number doubled.',
  tests: [{ input: '1\n', output: '2\n' }, { input: '2\n', output: '4\n' }, { input: '3\n', output: '6\n' }],
}) as StdioTask;

const sabotage: Record<string, string> = {
  'locks it (chmod 000)': 'import os\nos.chmod(".", 0)\nprint(int(input()) * 3)',
  'removes it': 'import os, shutil\nshutil.rmtree(os.getcwd())\nprint(int(input()) * 3)',
  'puts a dangling symlink in its place': 'import os\nd = os.getcwd()\nos.rename(d, d + "-gone")\nos.symlink("/nonexistent", d)\nprint(int(input()) * 3)',
};

describe('stdio grading: a program that wrecks its own directory fails its tests, the evaluation does not fail', () => {
  for (const [what, program] of Object.entries(sabotage)) {
    it(`a program that ${what}`, async () => {
      const sandbox = await driver.start(testSpec({ wallClockMs: 60_000 }));
      started.push(sandbox);
      const run = await runStdioTests(sandbox, task, program, new AbortController().signal);
      expect(run.tests.map((t) => t.status)).toEqual(['wrong_answer', 'runtime_error', 'runtime_error']);
      expect(run.tests[1]!.detail).toContain('its own directory');
    }, 60_000);
  }
});
