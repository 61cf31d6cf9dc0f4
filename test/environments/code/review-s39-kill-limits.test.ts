import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runHumanEvalTests } from '../../../src/environments/code/humaneval-runner.js';
import { validateCodeInstance, type HumanEvalTask } from '../../../src/environments/code/instance.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

// Review s39 (helper-90, code environment). The solution's processes run as the judge's uid: besides signalling it
// (review-s39-judge-signals.test.ts), they can lower its resource limits with prlimit(2), which needs only a matching
// uid (not ptrace access, so the judge's non-dumpable state does not stop it). A judge left without descriptors or
// memory failed in its own code ("the harness failed", "the task's test code did not load"): a wrong solution traded
// its reward 0 for an ENVIRONMENT_ERROR the trainer drops.

const signal = new AbortController().signal;
const task = validateCodeInstance({
  prompt: 'def add(a, b):\n    """Sum of a and b."""\n',
  test: `import math\n\ndef check(f):\n${Array.from({ length: 20 }, (_, i) => `    assert f(${i}, 1) == ${i + 1}`).join('\n')}\n`,
  entry_point: 'add',
  timeout_s: 20,
}) as HumanEvalTask;

/** A wrong solution that, on loading, runs `attack` with JUDGE the judge's pid (its worker's grandparent). */
function wrongSolutionThat(...attack: string[]): string {
  return [
    '    return a - b  # wrong',
    'import os, resource',
    'def _parent(pid):',
    '    with open("/proc/%d/stat" % pid) as f:',
    '        return int(f.read().rsplit(")", 1)[1].split()[1])',
    'JUDGE = _parent(os.getppid())',
    ...attack,
  ].join('\n');
}

describe('HumanEval harness: resource limits the solution forces on the judge decide nothing but its own failure', () => {
  const driver = closeAfterAll(new BubblewrapDriver());
  let sandbox: Sandbox;
  beforeAll(async () => {
    sandbox = await driver.start(testSpec({ wallClockMs: 120_000 }));
  });
  afterAll(async () => {
    await sandbox?.stop();
  });

  it('a judge left without file descriptors (RLIMIT_NOFILE 0) fails a wrong solution, not the evaluation', async () => {
    const run = await runHumanEvalTests(sandbox, task, wrongSolutionThat('resource.prlimit(JUDGE, resource.RLIMIT_NOFILE, (0, 0))'), signal);
    expect(run.tests.some((t) => t.passed)).toBe(false);
  }, 60_000);

  it('a judge left without address space (RLIMIT_AS at its current size) fails a wrong solution, not the evaluation', async () => {
    const attack = [
      'def _size(pid):',
      '    for line in open("/proc/%d/status" % pid):',
      '        if line.startswith("VmSize:"):',
      '            return int(line.split()[1]) * 1024',
      'resource.prlimit(JUDGE, resource.RLIMIT_AS, (_size(JUDGE), _size(JUDGE)))',
    ];
    const run = await runHumanEvalTests(sandbox, task, wrongSolutionThat(...attack), signal);
    expect(run.tests.some((t) => t.passed)).toBe(false);
  }, 60_000);

  it('test code that does not load is still the evaluation failure when the solution touched nothing', async () => {
    const broken = { ...task, test: 'import no_such_module_anywhere\n\ndef check(f):\n    assert f(1, 1) == 2\n' };
    await expect(runHumanEvalTests(sandbox, broken, '    return a - b', signal)).rejects.toMatchObject({ code: 'environment_error' });
  }, 60_000);

  it('test code that does not load is the evaluation failure even when the solution does not load either', async () => {
    // The judge loads the test code before it starts the solution: a solution that did not load (or that wrecked
    // the judge's limits as it loaded) decided nothing about a broken task, which was reward 0 for such solutions.
    const broken = { ...task, test: 'import no_such_module_anywhere\n\ndef check(f):\n    assert f(1, 1) == 2\n' };
    await expect(runHumanEvalTests(sandbox, broken, '    return a -', signal)).rejects.toMatchObject({ code: 'environment_error' });
    const uncallable = { ...task, test: 'check = 3\nassert True\n' };
    await expect(runHumanEvalTests(sandbox, uncallable, '    return a -', signal)).rejects.toMatchObject({ code: 'environment_error' });
  }, 60_000);

  it('a judge that opens nothing once the solution runs: RLIMIT_NOFILE 0 changes no verdict', async () => {
    const correct = ['    return a + b', 'import os, resource', 'def _parent(pid):', '    with open("/proc/%d/stat" % pid) as f:', '        return int(f.read().rsplit(")", 1)[1].split()[1])', 'resource.prlimit(_parent(os.getppid()), resource.RLIMIT_NOFILE, (0, 0))'].join('\n');
    const run = await runHumanEvalTests(sandbox, task, correct, signal);
    expect(run.tests.every((t) => t.passed)).toBe(true);
  }, 60_000);
});
