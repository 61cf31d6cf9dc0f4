import { spawn } from 'node:child_process';
import type { Readable } from 'node:stream';
import { CappedOutput } from './capped-output.js';

/** Descriptor the in-sandbox wrapper writes one byte to, right before it execs the user's argv. */
export const STARTED_FD = 3;

export interface ContainedRunOptions {
  stdin?: string;
  timeoutMs: number;
  outputLimitBytes: number;
  signal?: AbortSignal;
  /** Environment of the launcher; default only PATH and LANG (the launcher decides what the sandbox sees). */
  env?: Readonly<Record<string, string>>;
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
  /** The wrapper reported (on fd 3) that the sandbox was set up and the user's argv is about to run. */
  started: boolean;
  /** Set when the launcher itself could not be spawned (e.g. ENOENT). */
  spawnError?: Error;
  durationMs: number;
}

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
 * Why a process group and not a name or a PID list: the launcher is bwrap, whose group holds the outer bwrap
 * and the PID-namespace init; killing them makes the kernel kill everything in the namespace (init dying
 * tears the namespace down), including processes that called setsid() or double-forked. Nothing is ever
 * matched by process name.
 */
export function spawnContained(command: string, args: readonly string[], options: ContainedRunOptions): ContainedProcess {
  const started = performance.now();
  const stdout = new CappedOutput(options.outputLimitBytes);
  const stderr = new CappedOutput(options.outputLimitBytes);
  let timedOut = false;
  let aborted = false;
  let killed = false;
  let sawStart = false;

  const child = spawn(command, [...args], {
    detached: true,
    stdio: [options.stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe', 'pipe'],
    env: options.env ?? { PATH: process.env.PATH ?? '/usr/bin:/bin', LANG: 'C.UTF-8' },
  });

  const killGroup = (): void => {
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
    startedPipe?.on('data', () => {
      sawStart = true;
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
    child.on('close', (code, signal) => {
      clearTimeout(timer);
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
        started: sawStart,
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
