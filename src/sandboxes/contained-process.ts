import { spawn } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import { STARTED_FD } from './bwrap-command.js';
import { CappedOutput } from './capped-output.js';
import { LAUNCH_ENV } from './bwrap-holder.js';

export interface ContainedRunOptions {
  stdin?: string;
  timeoutMs: number;
  outputLimitBytes: number;
  signal?: AbortSignal;
  /** Environment of the launcher; default only PATH and LANG (the launcher decides what the sandbox sees). */
  env?: Readonly<Record<string, string>>;
  /** Descriptors of this process handed to the command as fd 4, 5, ... (the sandbox's namespaces). */
  fds?: readonly number[];
  /** Kills what the command started beyond its process group (its cgroup); called with every kill. */
  killTree?: () => void;
}

export interface ContainedRunResult {
  exitCode: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  aborted: boolean;
  /** Killed by `kill()` from outside (sandbox stop). */
  killed: boolean;
  truncated: boolean;
  droppedBytes: number;
  /**
   * The command exited but its output pipes stayed open past OUTPUT_GRACE_MS (a process it left running, e.g. in the
   * background, inherited them): the result is its exit status with the output read until then, and the pipes were
   * closed on this side (what that process writes to them from then on is lost, or ends it with SIGPIPE).
   */
  outputHeld: boolean;
  /** What the wrapper reported on fd 3: `1` the user's argv is about to run, `c` the cwd is no directory. */
  startByte: string | undefined;
  /** Set when the launcher itself could not be spawned (e.g. ENOENT). */
  spawnError?: Error;
  durationMs: number;
}

/**
 * How long output is still read after the command exited while something it left running holds the pipes open. What
 * the command itself wrote is already in the pipes by then: this only lets it be read.
 */
export const OUTPUT_GRACE_MS = 250;

/** A running contained process: its result and a way to kill its whole tree. */
export interface ContainedProcess {
  readonly pid: number | undefined;
  readonly result: Promise<ContainedRunResult>;
  /** SIGKILLs the process group (idempotent); the result then resolves with `killed`. */
  kill(): void;
}

/**
 * Spawns `command` as the leader of a new process group (detached), with stdout/stderr capped, a timeout and
 * an AbortSignal, all of which SIGKILL the whole group.
 *
 * Why a process group plus `killTree`: the group holds the launcher chain and the command (nsenter keeps the
 * group); `killTree` kills the command's own cgroup, which also holds what called setsid() or double-forked.
 * Nothing is ever matched by process name.
 */
export function spawnContained(command: string, args: readonly string[], options: ContainedRunOptions): ContainedProcess {
  const started = performance.now();
  const stdout = new CappedOutput(options.outputLimitBytes);
  const stderr = new CappedOutput(options.outputLimitBytes);
  let timedOut = false;
  let aborted = false;
  let killed = false;
  let startByte: string | undefined;
  let outputHeld = false;

  const child = spawn(command, [...args], {
    detached: true,
    stdio: [options.stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe', 'pipe', ...(options.fds ?? [])],
    env: options.env ?? LAUNCH_ENV,
  });

  const killGroup = (): void => {
    options.killTree?.();
    if (child.pid === undefined) return;
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      // ESRCH: the group is already gone.
    }
  };

  const result = new Promise<ContainedRunResult>((resolve) => {
    let spawnError: Error | undefined;
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup();
    }, Math.max(0, options.timeoutMs));
    const onAbort = (): void => {
      aborted = true;
      killGroup();
    };
    if (options.signal?.aborted) onAbort();
    else options.signal?.addEventListener('abort', onAbort, { once: true });

    child.stdout?.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.stderr?.on('data', (chunk: Buffer) => stderr.push(chunk));
    const startedPipe = child.stdio[STARTED_FD] as Readable | null | undefined;
    startedPipe?.on('data', (chunk: Buffer) => {
      startByte ??= chunk.toString('latin1', 0, 1);
    });
    startedPipe?.on('error', () => undefined);
    if (child.stdin) {
      // The program may exit without reading its input: EPIPE is expected, not an error.
      child.stdin.on('error', () => undefined);
      child.stdin.end(options.stdin);
    }
    child.on('error', (err) => {
      spawnError = err;
    });
    // 'close' waits for every pipe to close, which a background process of the command may hold open for its whole
    // life: once the command has exited, its timeout no longer applies, and after a grace its pipes are closed here.
    let grace: NodeJS.Timeout | undefined;
    let closing: NodeJS.Immediate | undefined;
    child.once('exit', () => {
      clearTimeout(timer);
      // The pipes are closed from the check phase after the timer, not from the timer itself: when the event loop was
      // blocked past the grace (many sandboxes starting at once), timers run before the poll phase that reads what is
      // already in the pipes, and the command's output and started byte were lost ("could not enter sandbox (exit 0)").
      grace = setTimeout(() => {
        closing = setImmediate(() => {
          outputHeld = true;
          for (const stream of child.stdio) (stream as Readable | Writable | null)?.destroy();
        });
      }, OUTPUT_GRACE_MS);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      clearTimeout(grace);
      clearImmediate(closing);
      options.signal?.removeEventListener('abort', onAbort);
      resolve({
        exitCode: code,
        signal,
        stdout: stdout.text(),
        stderr: stderr.text(),
        timedOut,
        aborted,
        killed,
        truncated: stdout.truncated || stderr.truncated,
        droppedBytes: stdout.droppedBytes + stderr.droppedBytes,
        startByte,
        outputHeld,
        ...(spawnError !== undefined && { spawnError }),
        durationMs: Math.round(performance.now() - started),
      });
    });
  });

  return {
    pid: child.pid,
    result,
    kill: () => {
      killed = true;
      killGroup();
    },
  };
}
