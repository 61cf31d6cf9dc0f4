import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runHumanEvalTests } from '../../../src/environments/code/humaneval-runner.js';
import { validateCodeInstance, type HumanEvalTask } from '../../../src/environments/code/instance.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

// Review s39 (helper-85, code environment). Every process of the grading sandbox runs as one uid, so the solution can
// signal the judge. SIGINT is the one signal Python turns into an exception (KeyboardInterrupt): raised while the
// judge was between tests it escaped to the harness's top level as a harness_error, which the runner reports as
// environment_error - a wrong solution traded its reward 0 for an ENVIRONMENT_ERROR the trainer drops.

const signal = new AbortController().signal;
const task = validateCodeInstance({
  prompt: 'def add(a, b):\n    """Sum of a and b."""\n',
  test: `def check(f):\n${Array.from({ length: 200 }, (_, i) => `    assert f(${i}, 1) == ${i + 1}`).join('\n')}\n`,
  entry_point: 'add',
  timeout_s: 20,
}) as HumanEvalTask;

describe('HumanEval harness: signals the solution sends the judge decide nothing but its own failure', () => {
  const driver = closeAfterAll(new BubblewrapDriver());
  let sandbox: Sandbox;
  beforeAll(async () => {
    sandbox = await driver.start(testSpec({ wallClockMs: 120_000 }));
  });
  afterAll(async () => {
    await sandbox?.stop();
  });

  it('a daemon interrupting the judge (SIGINT) over and over leaves a wrong solution at reward 0, not an evaluation failure', async () => {
    // The worker's parent is the zygote, whose parent is the judge: a detached process keeps interrupting the judge
    // wherever it is (inside a test statement, between tests, while it writes a result).
    const interrupter = [
      '    return a - b  # wrong',
      'import os, signal, time',
      'def _judge():',
      '    zygote = os.getppid()',
      '    with open("/proc/%d/stat" % zygote) as f:',
      '        return int(f.read().rsplit(")", 1)[1].split()[1])',
      '_target = _judge()',
      'def _first():  # one interrupter, though every test loads the solution again',
      '    try:',
      '        os.close(os.open("/tmp/interrupter", os.O_CREAT | os.O_EXCL))',
      '        return True',
      '    except FileExistsError:',
      '        return False',
      'if _first() and os.fork() == 0:',
      '    os.setsid()',
      '    deadline = time.monotonic() + 15',
      '    while time.monotonic() < deadline:',
      '        try:',
      '            os.kill(_target, signal.SIGINT)',
      '        except ProcessLookupError:',
      '            break',
      '        time.sleep(0.0005)',
      '    os._exit(0)',
    ].join('\n');
    const run = await runHumanEvalTests(sandbox, task, interrupter, signal);
    expect(run.tests.some((t) => t.passed)).toBe(false);
  }, 120_000);

  it('SIGINT does not reach the judge: a correct solution that sends it is graded whole', async () => {
    const correct = ['    return a + b', 'import os, signal', 'os.kill(int(open("/proc/%d/stat" % os.getppid()).read().rsplit(")", 1)[1].split()[1]), signal.SIGINT)'].join('\n');
    const run = await runHumanEvalTests(sandbox, task, correct, signal);
    expect(run.tests.every((t) => t.passed)).toBe(true);
  }, 120_000);
});
