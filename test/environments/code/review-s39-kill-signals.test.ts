import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runHumanEvalTests } from '../../../src/environments/code/humaneval-runner.js';
import { validateCodeInstance, type HumanEvalTask } from '../../../src/environments/code/instance.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

// Review s39 (helper-90, code environment). The solution's processes share the judge's uid and so can signal it; the
// signals it cannot ignore must end as the solution's failure (reward 0), never as an evaluation failure
// (ENVIRONMENT_ERROR, SANDBOX_ERROR) a trainer drops. These held already when written (the one that did not, SIGINT,
// is review-s39-judge-signals.test.ts): they keep the contract of the harness's header.

const signal = new AbortController().signal;
function task(timeoutS: number): HumanEvalTask {
  return validateCodeInstance({
    prompt: 'def add(a, b):\n    """Sum of a and b."""\n',
    test: `def check(f):\n${Array.from({ length: 10 }, (_, i) => `    assert f(${i}, 1) == ${i + 1}`).join('\n')}\n`,
    entry_point: 'add',
    timeout_s: timeoutS,
  }) as HumanEvalTask;
}

/** A wrong solution that, on loading, runs `attack` with JUDGE the judge's pid (its worker's grandparent). */
function wrongSolutionThat(attack: string): string {
  return [
    '    return a - b  # wrong',
    'import os, signal',
    'def _parent(pid):',
    '    with open("/proc/%d/stat" % pid) as f:',
    '        return int(f.read().rsplit(")", 1)[1].split()[1])',
    'JUDGE = _parent(os.getppid())',
    attack,
  ].join('\n');
}

describe('HumanEval harness: a solution that kills or stops its judge fails its tests', () => {
  const driver = closeAfterAll(new BubblewrapDriver());
  let sandbox: Sandbox;
  beforeAll(async () => {
    sandbox = await driver.start(testSpec({ wallClockMs: 120_000 }));
  });
  afterAll(async () => {
    await sandbox?.stop();
  });

  it.each([
    ['SIGKILL to the judge', 'os.kill(JUDGE, signal.SIGKILL)'],
    ['SIGTERM to the judge', 'os.kill(JUDGE, signal.SIGTERM)'],
    ['SIGHUP to the judge', 'os.kill(JUDGE, signal.SIGHUP)'],
    ['SIGUSR1 to the judge', 'os.kill(JUDGE, signal.SIGUSR1)'],
    ['SIGKILL to every process it may signal', 'os.kill(-1, signal.SIGKILL)'],
    ['SIGKILL to its process group', 'os.kill(0, signal.SIGKILL)'],
    ['SIGKILL to the zygote', 'os.kill(os.getppid(), signal.SIGKILL)'],
  ])('%s: reward 0, not an evaluation failure', async (_name, attack) => {
    const run = await runHumanEvalTests(sandbox, task(20), wrongSolutionThat(attack), signal);
    expect(run.tests).toHaveLength(10);
    expect(run.tests.some((t) => t.passed)).toBe(false);
  }, 60_000);

  it('SIGSTOP to the judge: its tests fail at the time limit, the evaluation does not hang or fail', async () => {
    const run = await runHumanEvalTests(sandbox, task(5), wrongSolutionThat('os.kill(JUDGE, signal.SIGSTOP)'), signal);
    expect(run.tests.some((t) => t.passed)).toBe(false);
    expect(run.tests.every((t) => t.status === 'timeout')).toBe(true);
  }, 60_000);
});
