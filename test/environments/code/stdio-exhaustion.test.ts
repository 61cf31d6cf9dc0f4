import { afterEach, describe, expect, it } from 'vitest';
import { runStdioTests } from '../../../src/environments/code/stdio-runner.js';
import { validateCodeInstance, type StdioTask } from '../../../src/environments/code/instance.js';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../../src/sandboxes/bwrap.js';
import type { SandboxLimits } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

const driver = closeAfterAll(new BubblewrapDriver());
const started: BubblewrapSandbox[] = [];
async function start(overrides: Partial<SandboxLimits> = {}): Promise<BubblewrapSandbox> {
  const sandbox = await driver.start(testSpec(overrides));
  started.push(sandbox);
  return sandbox;
}
afterEach(async () => {
  await Promise.all(started.splice(0).map((s) => s.stop()));
});

const task = validateCodeInstance({
  prompt: 'Print the input number doubled.',
  tests: [{ input: '1\n', output: '2\n' }, { input: '2\n', output: '4\n' }, { input: '3\n', output: '6\n' }],
}) as StdioTask;

// Regression (review: stdio-grader-exhaustion). The submitted program (untrusted) wrecks the fresh grading sandbox during test 1; the remaining tests must be
// the program's failures (reward 0), not a thrown sandbox_error (SANDBOX_ERROR, filtered out by the trainer).
describe('stdio grading: a solution that exhausts the grading sandbox is graded, not an infrastructure failure', () => {
  it('a solution that leaves a detached process filling the pids limit', async () => {
    // Config defaults' shape: the grading sandbox is resolved from the same config as the episode's.
    const sandbox = await start({ maxProcesses: 64 });
    const program = [
      'import os, sys, time',
      'if os.fork() == 0:',
      '    fd = os.open("/dev/null", os.O_RDWR)',
      '    for n in (0, 1, 2): os.dup2(fd, n)',
      '    os.setsid()',
      '    while True:',
      '        try:',
      '            if os.fork() == 0: time.sleep(1000); os._exit(0)',
      '        except OSError: time.sleep(0.05)',
      'time.sleep(1)',
      'print(int(input()) * 3)',
    ].join('\n');
    const run = await runStdioTests(sandbox, task, program, new AbortController().signal);
    expect(run.tests.every((t) => !t.passed)).toBe(true);
    // Each test's leftovers are killed with it: every test ran the program again (a wrong answer), none was refused.
    expect(run.tests.map((t) => t.status)).toEqual(['wrong_answer', 'wrong_answer', 'wrong_answer']);
    expect(run.completed).toBe(true);
  }, 90_000);
});
