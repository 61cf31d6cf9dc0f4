import { RolloutError } from '../errors.js';
import type { CgroupUsage } from './cgroups.js';
import type { SandboxLimits } from './types.js';

/**
 * A sandbox operation that failed because the sandbox is at one of its own limits (process count, memory): what
 * the model did inside its own sandbox, not an infrastructure failure. Its message is written for the model.
 *
 * Its code stays sandbox_error so that a caller that does not know it fails exactly as before (loudly); the
 * callers that act for the policy turn it into the policy's outcome: the tool executor into an error
 * observation (src/tools/execute.ts), the stdio grader into a failed test. Survives RolloutError.from (same
 * instance), so wrappers keep it recognisable.
 */
export class SandboxLimitError extends RolloutError {
  constructor(
    readonly limit: 'processes' | 'memory',
    message: string,
    /** Whether the sandbox is gone (its memory limit's OOM killer took its holder): every later call fails too. */
    readonly fatal: boolean,
  ) {
    super('sandbox_error', message);
    this.name = 'SandboxLimitError';
  }
}

export function isSandboxLimitError(err: unknown): err is SandboxLimitError {
  return err instanceof SandboxLimitError;
}

/** What failed: a command's launcher (nsenter) before the command ran, or the sandbox's holder (it died). */
export type SandboxFailure =
  | { kind: 'launch'; signal: string | null; detail: string }
  | { kind: 'died' };

/** Processes a launcher chain may hold when the count is read after it failed (it has exited by then). */
const PIDS_SLACK = 2;
/** Memory within this of the limit counts as "at the limit" (the kernel reclaims a little below it). */
function memorySlackBytes(limitBytes: number): number {
  return Math.max(4 * 1024 * 1024, Math.floor(limitBytes * 0.03));
}

/**
 * Decides whether a failure is the sandbox's own limit at work, from what its cgroups say right after it:
 * - processes: the sandbox is (still) at pids.max, less the failed launcher's own processes; a launcher that
 *   cannot fork inside the sandbox's pids cgroup fails then ("nsenter: fork failed").
 * - memory: the memory cgroup hit its limit (failcnt / events max) or OOM-killed in it, and either its use is at
 *   the limit now (tmpfs files hold it there), or the failed launcher was SIGKILLed and an OOM kill happened; a
 *   holder that died with OOM kills in its cgroup died of them (nothing else of the sandbox SIGKILLs it).
 * Anything else — no cgroups, limits far away, a launcher that failed with room left — is no limit: the caller
 * keeps reporting an infrastructure failure.
 */
export function exhaustedLimit(usage: CgroupUsage | undefined, failure: SandboxFailure, limits: SandboxLimits): SandboxLimitError | undefined {
  const memory = usage?.memory;
  const pids = usage?.pids;
  const memoryText = `${limits.memoryMb} MiB, files in /tmp and the workspace included`;
  if (failure.kind === 'died') {
    if (!memory || memory.oomKills === 0) return undefined;
    return new SandboxLimitError('memory', `the sandbox ran out of memory (limit ${memoryText}) and was killed: its files and processes are gone and no further command can run in it.`, true);
  }
  const detail = failure.detail.replace(/^nsenter: /, '').trim();
  const why = detail === '' ? '' : ` (${detail.slice(0, 200)})`;
  if (pids && pids.current >= pids.max - PIDS_SLACK) {
    return new SandboxLimitError(
      'processes',
      `the sandbox is out of processes (pids.max ${limits.maxProcesses}): processes left running, e.g. in the background, use them all, so this command could not start${why}. Stop them (the bash builtin kill needs no new process) or let them exit.`,
      false,
    );
  }
  if (memory && (memory.failures > 0 || memory.oomKills > 0)) {
    const full = memory.usageBytes >= memory.limitBytes - memorySlackBytes(memory.limitBytes);
    if (full || (failure.signal === 'SIGKILL' && memory.oomKills > 0)) {
      return new SandboxLimitError('memory', `the sandbox is out of memory (limit ${memoryText}), so this command could not start${why}. Free memory: delete large files, stop background processes.`, false);
    }
  }
  return undefined;
}
