/**
 * What running a solution's tests gave, in both task formats, and how a test process is started in the sandbox.
 */

/**
 * One test's outcome. `passed` is the verdict; `status` says why: 'passed' | 'failed' (an assert or exception in
 * a HumanEval-format test) | 'wrong_answer' | 'runtime_error' (non-zero exit, killed) | 'timeout' |
 * 'output_limit' (stdout or stderr past the cap) | 'not_run' (skipped after an earlier timeout).
 */
export interface TestOutcome {
  index: number;
  passed: boolean;
  status: 'passed' | 'failed' | 'wrong_answer' | 'runtime_error' | 'timeout' | 'output_limit' | 'not_run';
  /** A short explanation for the report: the exception, the first differing token, the end of stderr. */
  detail?: string;
  /** Wall time of the test's process, ms (stdin/stdout tests only: HumanEval-format tests share one process). */
  timeMs?: number;
}

export interface TestRun {
  tests: TestOutcome[];
  /** Wall time of all test processes together, ms. */
  durationMs: number;
  /** Whether every test ran to a verdict of its own (false after a timeout or an early exit). */
  completed: boolean;
}

/**
 * argv that runs `argv` under an address-space limit (RLIMIT_AS, `ulimit -v`) of `memoryMb` MiB, through the
 * sandbox's /bin/sh. Why RLIMIT_AS and not only the sandbox's memory cgroup: the cgroup holds the whole sandbox
 * (the model's shell too), while a test needs its own limit so that a runaway allocation fails as that test's
 * MemoryError instead of an OOM kill of the sandbox.
 */
export function limitedCommand(memoryMb: number, argv: readonly string[]): string[] {
  return ['/bin/sh', '-c', 'ulimit -v "$1" 2>/dev/null; shift; exec "$@"', 'sh', String(memoryMb * 1024), ...argv];
}
