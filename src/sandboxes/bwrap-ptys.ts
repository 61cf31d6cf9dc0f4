import type { SandboxIdentity } from './bwrap-command.js';
import { namespaceFdNumbers, type Holder } from './bwrap-holder.js';
import { spawnContained } from './contained-process.js';
import type { FdCloser } from './fd-closer.js';
import { SANDBOX_INIT_PATH } from './init/sandbox-init.js';

/**
 * Ptys one bubblewrap sandbox may hold at once. Why a limit: bwrap's devpts instance has none of its own, and every
 * devpts instance but the host's draws on one pool (kernel.pty.max − kernel.pty.reserve: 3072 by default). Measured
 * (review s36): one sandbox opened /dev/ptmx 3071 times, and `os.openpty()` in every other sandbox of the host then
 * failed with ENOSPC. 32 is plenty for what tools do with ptys (pexpect, `script`, a test suite's pty tests).
 */
export const MAX_PTYS_PER_SANDBOX = 32;

/** How long the mount may take, ms. */
const TIMEOUT_MS = 10_000;

/**
 * Mounts a devpts instance of at most `max` ptys over the sandbox's /dev/pts (/dev/ptmx is bwrap's symlink to
 * pts/ptmx, so it follows). Run by the server, not the sandbox: the sandbox init's `--mount-devpts` mode
 * (init/sandbox-init.c, static, bound read-only at SANDBOX_INIT_PATH), entered into the sandbox's mount namespace and
 * root with the privilege the server has over them — host root (setuid identity) directly; the owner of the sandbox's
 * user namespace (userns identity) by joining it, or, for a server that is not root, the user namespace owning that
 * one. Resolves to undefined when done, else why not (never throws: the caller starts the sandbox without the limit
 * and says so).
 */
export async function limitPtys(holder: Holder, options: { identity: SandboxIdentity; closer: FdCloser; max?: number }): Promise<string | undefined> {
  const fds = namespaceFdNumbers(holder.namespaces);
  // A server that is not root joins the user namespace owning the mount namespace (the holder's own is nested in it:
  // see enterOwnerArgv in bwrap-command.ts); its uid is root there, hence --preserve-credentials (no setgroups()).
  const user = fds.owner !== undefined ? ['--preserve-credentials', `--user=/proc/self/fd/${fds.owner}`]
    : options.identity.kind === 'userns' ? [`--user=/proc/self/fd/${fds.user}`] : [];
  const argv = options.closer.wrap(Object.values(fds), [
    'nsenter', ...user,
    `--mount=/proc/self/fd/${fds.mnt}`, `--root=/proc/self/fd/${fds.root}`, '--',
    SANDBOX_INIT_PATH, '--mount-devpts', String(options.max ?? MAX_PTYS_PER_SANDBOX),
  ]);
  const r = await spawnContained(argv[0]!, argv.slice(1), { timeoutMs: TIMEOUT_MS, outputLimitBytes: 4096, fds: holder.namespaces.fds }).result;
  if (r.spawnError) return r.spawnError.message;
  if (r.timedOut) return `timed out after ${TIMEOUT_MS} ms`;
  if (r.exitCode !== 0) return `exit ${r.exitCode ?? r.signal}: ${r.stderr.trim().slice(0, 500)}`;
  return undefined;
}
