import { randomUUID } from 'node:crypto';
import { RolloutError } from '../../errors.js';
import { isSandboxLimitError } from '../../sandboxes/limit-errors.js';
import type { ExecResult, Sandbox } from '../../sandboxes/types.js';
import type { StdioTask } from './instance.js';
import { judgeOutput } from './judge.js';
import { limitedCommand, type TestOutcome, type TestRun } from './test-run.js';

/** Characters of stderr kept in a runtime error's detail (its end, where the traceback's message is). */
const STDERR_TAIL = 300;

export interface StdioRunOptions {
  /**
   * Wall time all the tests may take together, ms (default: no bound of their own). A test starts with its time
   * limit cut to what is left; once nothing is left, the remaining tests are not run and fail. Per-test limits add up
   * (1000 tests at 4 s), and a run that outlasts the eval stage's budget ends as TIMEOUT, which trainers drop: a wrong
   * program sleeping just under the limit on every test would trade its reward 0 for that.
   */
  budgetMs?: number;
}

/**
 * Runs a stdin/stdout task's tests on `program` inside the sandbox, in order: each test is a fresh
 * `python3 -I solution.py` with the test's input on stdin, the task's time limit and address-space limit, and its
 * stdout judged by {@link judgeOutput} (with the task's float tolerance, when it gives one). Output past the sandbox's per-command cap is 'output_limit' (the sandbox
 * request of the code environment sizes that cap to the largest expected output). After the first timeout the
 * remaining tests are not run and count as failed: a program that hangs on one input mostly hangs on the next
 * too, and each would cost the full time limit of the evaluation's budget. The same after the tests' total time
 * (`options.budgetMs`) is used up: what is left fails as 'not_run', the program's slowness.
 *
 * Each test's leftover processes are killed when it ends. A test that cannot start because an earlier one filled
 * the sandbox to its own process or memory limit fails ('runtime_error'), as the program's doing; so does a test that
 * cannot enter the solution's directory after an earlier one did (the program removed or locked it).
 *
 * Throws when the evaluation itself failed: environment_error when the sandbox has no working python3, or the
 * solution file cannot be written; sandbox errors propagate as they are.
 */
export async function runStdioTests(sandbox: Sandbox, task: StdioTask, program: string, signal: AbortSignal, options: StdioRunOptions = {}): Promise<TestRun> {
  await checkPython(sandbox, signal);
  // A fresh, unguessable directory: the model cannot have planted anything there.
  const dir = `/tmp/rollout-eval-${randomUUID()}`;
  const file = `${dir}/solution.py`;
  try {
    await sandbox.writeFile(file, program, { signal });
  } catch (err) {
    throw RolloutError.from(err, 'environment_error');
  }
  const timeoutMs = Math.round(task.timeLimitS * 1000);
  const argv = limitedCommand(task.memoryLimitMb, ['python3', '-I', file]);
  const tests: TestOutcome[] = [];
  const budgetMs = options.budgetMs ?? Infinity;
  const totalText = `the tests' total time of ${budgetMs / 1000} s`;
  const started = performance.now();
  let durationMs = 0;
  let timedOut = false;
  let entered = false;
  for (const [index, test] of task.tests.entries()) {
    if (timedOut) {
      tests.push({ index, passed: false, status: 'not_run', detail: 'not run after an earlier test timed out' });
      continue;
    }
    const leftMs = Math.floor(budgetMs - (performance.now() - started));
    if (leftMs <= 0) {
      timedOut = true;
      tests.push({ index, passed: false, status: 'not_run', detail: `not run: the earlier tests used up ${totalText}` });
      continue;
    }
    const cut = leftMs < timeoutMs;
    // Each test's leftovers (a daemon the program forked) are killed with it: they must not take the next test's
    // processes or memory.
    let r: ExecResult;
    try {
      r = await sandbox.exec(argv, { stdin: test.input, timeoutMs: cut ? leftMs : timeoutMs, signal, cwd: dir, killLeftovers: true });
    } catch (err) {
      // The directory an earlier test entered can no longer be entered: the program (its owner, same uid) removed,
      // locked or replaced it. Its doing, so its tests fail; only the first test's failure to enter it is the grading's.
      if (entered && err instanceof RolloutError && err.code === 'invalid_argument' && err.field === 'cwd') {
        tests.push({ index, passed: false, status: 'runtime_error', detail: 'the program removed or locked its own directory, which the tests run in' });
        continue;
      }
      // The program filled the grading sandbox to its process or memory limit (what the untrusted program did,
      // not the infrastructure): this test fails; the next ones still run (its leftovers are gone), unless the
      // sandbox died of it.
      if (!isSandboxLimitError(err)) throw err;
      tests.push({ index, passed: false, status: 'runtime_error', detail: err.message });
      if (err.fatal) {
        for (const rest of task.tests.keys()) if (rest > index) tests.push({ index: rest, passed: false, status: 'not_run', detail: 'not run: the sandbox died of its memory limit' });
        return { tests, durationMs, completed: false };
      }
      continue;
    }
    entered = true;
    durationMs += r.durationMs;
    const timeMs = Math.round(r.durationMs);
    if (r.timedOut) timedOut = true;
    if (r.truncated) {
      tests.push({ index, passed: false, status: 'output_limit', detail: `the program wrote more than the output limit${r.timedOut ? ' and ran out of time' : ''}`, timeMs });
    } else if (r.timedOut) {
      const over = cut ? `over the ${leftMs / 1000} s left of ${totalText}` : `over the ${task.timeLimitS} s time limit`;
      tests.push({ index, passed: false, status: 'timeout', detail: over, timeMs });
    } else if (r.exitCode !== 0) {
      const how = r.exitCode === null ? `killed by ${r.signal ?? 'a signal'}` : `exit code ${r.exitCode}`;
      const tail = r.stderr.trimEnd().slice(-STDERR_TAIL);
      tests.push({ index, passed: false, status: 'runtime_error', detail: tail ? `${how}: ${tail}` : how, timeMs });
    } else {
      const verdict = judgeOutput(r.stdout, test.output, task.floatTolerance);
      tests.push({ index, passed: verdict.accepted, status: verdict.accepted ? 'passed' : 'wrong_answer', ...(verdict.difference && { detail: verdict.difference }), timeMs });
    }
  }
  return { tests, durationMs, completed: !timedOut };
}

/** Fails the evaluation (not the model) when the sandbox cannot run Python at all. */
async function checkPython(sandbox: Sandbox, signal: AbortSignal): Promise<void> {
  const r = await sandbox.exec(['python3', '-I', '-c', 'print("ok")'], { timeoutMs: 30_000, signal, killLeftovers: true });
  if (r.exitCode !== 0 || r.stdout.trim() !== 'ok') {
    throw new RolloutError('environment_error', `the sandbox cannot run python3 (exit ${r.exitCode ?? r.signal}): ${r.stderr.slice(-300)}`);
  }
}
