import { accessSync, constants } from 'node:fs';
import { DEFAULT_SANDBOX_INIT } from './init/sandbox-init.js';

/**
 * How every process a driver starts gets only the descriptors the driver means to give it.
 *
 * Why: Node opens its own descriptors close-on-exec, but not those the server inherited (a harness's or supervisor's
 * pipe, a socket a parent passed). libuv's spawn leaves every such descriptor open in the child (`'ignore'` in a stdio
 * slot above 2 does not close it either), and neither bwrap, nsenter, setpriv, prlimit nor apptainer closes what it
 * was not told about: a host pipe (fd 251 of a test harness, once) reached every sandboxed process, which could read
 * or write it. So every launch starts with a closer that keeps 0, 1, 2 and the listed descriptors, then execs the
 * launch chain:
 *
 * - `init`: the sandbox init binary's `--keep-fds` mode (init/sandbox-init.c; close_range), the default wherever
 *   scripts/setup.sh built it;
 * - `bash`: the host's bash (`exec {fd}>&-` over /proc/self/fd), when there is no init binary;
 * - `none`: neither: nothing is closed (the driver warns).
 */
export interface FdCloser {
  readonly kind: 'init' | 'bash' | 'none';
  /** The host argv that runs `argv` with only descriptors 0, 1, 2 and `keep` open. */
  wrap(keep: readonly number[], argv: readonly string[]): string[];
}

/** Positional parameters: the comma-separated descriptors to keep, then the argv. */
const BASH_CLOSER = [
  'keep=",0,1,2,$1,"; shift',
  'for f in /proc/$$/fd/*; do',
  '  n=${f##*/}',
  // The glob's own directory descriptor is listed but already closed: lstat tells which are still open.
  '  case $keep in *",$n,"*) continue ;; esac',
  '  [ -L "$f" ] && exec {n}>&-',
  'done',
  'exec "$@"',
].join('\n');

/**
 * The closer of this host: the init binary at `init` (default ROLLOUT_SANDBOX_INIT, then the project's build) when it
 * is executable, else the host's bash, else none. Synchronous (a few access() calls), so drivers can take it at once.
 */
export function resolveFdCloser(init?: string): FdCloser {
  for (const path of [init, process.env.ROLLOUT_SANDBOX_INIT || undefined, DEFAULT_SANDBOX_INIT]) {
    if (path !== undefined && executable(path)) return initFdCloser(path);
  }
  for (const bash of ['/bin/bash', '/usr/bin/bash']) if (executable(bash)) return bashFdCloser(bash);
  return { kind: 'none', wrap: (_keep, argv) => [...argv] };
}

/** The closer of the sandbox init binary at `path` (its `--keep-fds` mode). */
export function initFdCloser(path: string): FdCloser {
  return { kind: 'init', wrap: (keep, argv) => [path, '--keep-fds', fdList(keep), '--', ...argv] };
}

/** The closer of the host's bash at `path`. */
export function bashFdCloser(path: string): FdCloser {
  return { kind: 'bash', wrap: (keep, argv) => [path, '-c', BASH_CLOSER, 'rollout-close-fds', fdList(keep), ...argv] };
}

function fdList(keep: readonly number[]): string {
  for (const fd of keep) if (!Number.isInteger(fd) || fd < 0) throw new Error(`bad descriptor ${fd}`);
  return keep.join(',');
}

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}
