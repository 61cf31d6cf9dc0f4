import { afterEach, describe, expect, it } from 'vitest';
import { runHumanEvalTests } from '../../../src/environments/code/humaneval-runner.js';
import { validateCodeInstance, type HumanEvalTask, type StdioTask } from '../../../src/environments/code/instance.js';
import { runStdioTests } from '../../../src/environments/code/stdio-runner.js';
import { BubblewrapDriver } from '../../../src/sandboxes/bwrap.js';
import type { Sandbox } from '../../../src/sandboxes/types.js';
import { closeAfterAll, testSpec } from '../../sandboxes/helpers.js';

// Review s43. `memory_limit_mb` is an address-space limit per test process (RLIMIT_AS); the grading sandbox has its own
// memory cgroup, which a task's limit may exceed (or several processes, each under it, fill together): the kernel's
// OOM killer then kills in the sandbox. Whatever it kills, that is the solution's doing: its tests fail (reward 0), the evaluation
// never fails as the environment's (an ENVIRONMENT_ERROR the trainer drops would turn a memory hog's 0 into nothing),
// and a correct solution run after it in a fresh sandbox still passes. Untested until now (the note's "memory-cgroup
// OOM untested"); run in real bubblewrap sandboxes with cgroup v1 limits (root on this machine).

const signal = new AbortController().signal;

/** Python that fills `mib` MiB (written, so resident), under its address-space limit but over the sandbox's memory. */
const fill = (mib: number): string => `_hog = b"x" * (${mib} << 20)`;

const stdioTask = validateCodeInstance({
  prompt: 'Read two integers and print their sum.',
  tests: [
    { input: '1 2\n', output: '3\n' },
    { input: '2 2\n', output: '4\n' },
  ],
  time_limit_s: 10,
  memory_limit_mb: 512,
}) as StdioTask;

const humanEvalTask = validateCodeInstance({
  prompt: 'def add(a, b):\n    """Sum of a and b."""\n',
  test: 'def check(f):\n    assert f(1, 2) == 3\n    assert f(2, 2) == 4\n',
  entry_point: 'add',
  timeout_s: 10,
  memory_limit_mb: 512,
}) as HumanEvalTask;

describe('a solution that fills the grading sandbox\'s memory cgroup (under its memory_limit_mb)', () => {
  const driver = closeAfterAll(new BubblewrapDriver());
  const started: Sandbox[] = [];
  afterEach(async () => {
    await Promise.all(started.splice(0).map((s) => s.stop()));
  });
  const sandbox = async (): Promise<Sandbox> => {
    const s = await driver.start(testSpec({ memoryMb: 256, wallClockMs: 120_000, commandTimeoutMs: 60_000 }));
    started.push(s);
    return s;
  };

  it('stdio: its tests fail as its own doing (no environment error); a correct program then passes', async () => {
    const hog = [fill(320), 'a, b = map(int, input().split())', 'print(a + b)'].join('\n');
    const run = await runStdioTests(await sandbox(), stdioTask, hog, signal);
    // The kernel's OOM kill (SIGKILL), not a MemoryError: the address-space limit was not reached.
    expect(run.tests).toEqual([expect.objectContaining({ status: 'runtime_error', detail: 'killed by SIGKILL' }), expect.objectContaining({ status: 'runtime_error', detail: 'killed by SIGKILL' })]);
    const correct = await runStdioTests(await sandbox(), stdioTask, 'a, b = map(int, input().split())\nprint(a + b)', signal);
    expect(correct.tests.map((t) => t.status)).toEqual(['passed', 'passed']);
  }, 120_000);

  it('HumanEval: a correct function whose module fills the memory at load fails, as its own doing', async () => {
    const hog = ['    return a + b', fill(320)].join('\n');
    const run = await runHumanEvalTests(await sandbox(), humanEvalTask, hog, signal);
    expect(run.tests.length).toBe(2);
    for (const t of run.tests) expect(t).toMatchObject({ passed: false, status: 'failed', detail: expect.stringContaining('killed by signal 9') });
    const correct = await runHumanEvalTests(await sandbox(), humanEvalTask, '    return a + b', signal);
    expect(correct.tests.every((t) => t.passed)).toBe(true);
  }, 120_000);
});
