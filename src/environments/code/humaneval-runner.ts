import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { RolloutError } from '../../errors.js';
import type { Sandbox } from '../../sandboxes/types.js';
import type { HumanEvalTask } from './instance.js';
import { limitedCommand, type TestOutcome, type TestRun } from './test-run.js';

let harnessSource: string | undefined;

/** The harness program (humaneval-harness.py beside this file), read once. */
function harness(): string {
  harnessSource ??= readFileSync(new URL('./humaneval-harness.py', import.meta.url), 'utf8');
  return harnessSource;
}

interface HarnessEvent {
  kind: 'ready' | 'result' | 'test_error' | 'harness_error' | 'done';
  total?: number;
  index?: number;
  passed?: boolean;
  error?: string;
}

/**
 * Runs a HumanEval-format task's tests on `completion` inside the sandbox: one Python program (isolated mode: no
 * PYTHON* variables, no user site, the working directory not on sys.path, so files the model left behind cannot
 * shadow modules) under the task's time and address-space limits, driven by humaneval-harness.py. Each top-level
 * statement of `check` that asserts is one test; the tests a timeout left without a result failed.
 *
 * Invariant: a verdict is decided by a process that never runs solution code. The harness's judge runs the test
 * code and calls the solution in per-test worker processes, receiving only return values as data, and only the
 * judge knows the nonce and holds the real stdout (see the harness's header for the design and its residual).
 *
 * The model's failures (syntax errors, exceptions, wrong results, timeouts, exiting early, printing floods) are
 * outcomes. Throws when the evaluation itself failed: environment_error when the harness never started (no
 * python3 in the image), the task's own test code does not load, or the harness's output was cut (the sandbox's cap is
 * below {@link harnessOutputBytes}); sandbox errors propagate as they are.
 */
export async function runHumanEvalTests(sandbox: Sandbox, task: HumanEvalTask, completion: string, signal: AbortSignal): Promise<TestRun> {
  const nonce = randomBytes(12).toString('hex');
  const timeoutMs = Math.round(task.timeoutS * 1000);
  const stdin = harnessInput(nonce, { prompt: task.prompt, completion, entry_point: task.entryPoint }, { test: task.test });
  const result = await sandbox.exec(limitedCommand(task.memoryLimitMb, ['python3', '-I', '-c', harness()]), { stdin, timeoutMs, signal, killLeftovers: true });
  // The harness's output is sized by the tests alone (see harnessOutputBytes): cut, it lost verdicts the tests earned,
  // which is the grading's failure, never the solution's reward 0.
  if (result.truncated) {
    throw new RolloutError('environment_error', `the HumanEval harness's output passed the sandbox's output limit (it needs up to ${harnessOutputBytes(task.test)} bytes for this task)`);
  }
  const events = parseEvents(result.stdout, nonce);
  const ready = events.find((e) => e.kind === 'ready');
  if (!ready) {
    if (result.timedOut) throw new RolloutError('environment_error', `the HumanEval harness did not start within ${task.timeoutS} s`);
    throw new RolloutError('environment_error', `the HumanEval harness did not start in the sandbox (exit ${result.exitCode ?? result.signal}): ${result.stderr.slice(-500)}`);
  }
  const problem = events.find((e) => e.kind === 'test_error' || e.kind === 'harness_error');
  if (problem) throw new RolloutError('environment_error', `${problem.kind === 'test_error' ? "the task's test code did not load" : 'the harness failed'}: ${problem.error ?? ''}`);
  const total = ready.total ?? 1;
  const byIndex = new Map<number, HarnessEvent>();
  for (const e of events) if (e.kind === 'result' && e.index !== undefined && e.index < total) byIndex.set(e.index, e);
  const finished = events.some((e) => e.kind === 'done');
  const missing: { status: TestOutcome['status']; detail: string } = result.timedOut
    ? { status: 'timeout', detail: `the test program ran out of its ${task.timeoutS} s` }
    : { status: 'runtime_error', detail: `the program ended before this test ran (${result.exitCode === null ? `killed by ${result.signal ?? 'a signal'}` : `exit code ${result.exitCode}`})` };
  const tests: TestOutcome[] = [];
  for (let index = 0; index < total; index++) {
    const event = byIndex.get(index);
    if (event) tests.push({ index, passed: event.passed === true, status: event.passed === true ? 'passed' : 'failed', ...(event.error && { detail: event.error }) });
    else tests.push({ index, passed: false, ...missing });
  }
  return { tests, durationMs: result.durationMs, completed: finished };
}

/** Bytes of the harness's line for one test without an error text: the nonce, the JSON, the index's digits, slack. */
const RESULT_LINE_BYTES = 96;
/** Tests whose result line may carry an error text, and its most bytes (the harness's _DETAILED_TESTS, _MAX_ERROR_JSON). */
const DETAILED_TESTS = 20;
const ERROR_LINE_BYTES = 96 + 1024;

/**
 * The most bytes the harness writes (stdout and stderr each) for a task's `test` code, whatever the solution does: a
 * result line per test, error texts for the first {@link DETAILED_TESTS} only, and its other events. Each test is a
 * statement holding an `assert`, so the occurrences of "assert" in the text bound their number without parsing Python.
 * The grading sandbox's output cap must be at least this (the code environment asks for it); the default 64 KiB cut
 * a correct solution's results off after about 850 tests.
 */
export function harnessOutputBytes(test: string): number {
  let asserts = 0;
  for (let at = test.indexOf('assert'); at !== -1; at = test.indexOf('assert', at + 6)) asserts++;
  return 4 * ERROR_LINE_BYTES + DETAILED_TESTS * ERROR_LINE_BYTES + Math.max(1, asserts) * RESULT_LINE_BYTES;
}

/**
 * The harness's stdin: "L1 L2\n", the solution part (L1 bytes), the test part (L2 bytes), the nonce and "\n". The
 * harness forks the process that runs the solution after reading the solution part and before reading the rest, so
 * the test and the nonce are never in its memory; the nonce is not in argv either (/proc/PID/cmdline is readable by
 * every process).
 */
function harnessInput(nonce: string, solution: object, test: object): string {
  const first = JSON.stringify(solution);
  const second = JSON.stringify(test);
  return `${Buffer.byteLength(first)} ${Buffer.byteLength(second)}\n${first}${second}${nonce}\n`;
}

/** The harness's JSON lines, recognised by the nonce; anything else on stdout is ignored. */
function parseEvents(stdout: string, nonce: string): HarnessEvent[] {
  const events: HarnessEvent[] = [];
  for (const line of stdout.split('\n')) {
    if (!line.startsWith(`${nonce} `)) continue;
    try {
      events.push(JSON.parse(line.slice(nonce.length + 1)) as HarnessEvent);
    } catch {
      // A line cut by the output cap: its test has no result.
    }
  }
  return events;
}
