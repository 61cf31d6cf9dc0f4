import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { RolloutError } from '../../errors.js';
import { resolveFdCloser } from '../fd-closer.js';

/**
 * The host side of squashfuse mounts: mount a squashfs at a byte offset of a file, unmount, and list what is
 * mounted (from /proc/self/mountinfo). Kept apart from the refcounting in sif-mount.ts so each is one idea.
 */

/** One line of /proc/self/mountinfo, reduced to what reaping and tests need. */
export interface MountEntry {
  /** Absolute mount point, unescaped. */
  mountPoint: string;
  /** e.g. "fuse.squashfuse". */
  fsType: string;
  source: string;
}

/** The mounts this process sees, in mount order. */
export async function listMounts(): Promise<MountEntry[]> {
  const text = await readFile('/proc/self/mountinfo', 'utf8');
  const mounts: MountEntry[] = [];
  for (const line of text.split('\n')) {
    const fields = line.split(' ');
    const dash = fields.indexOf('-', 6);
    if (fields.length < 10 || dash < 0) continue;
    mounts.push({ mountPoint: unescapeMountField(fields[4]!), fsType: fields[dash + 1] ?? '', source: unescapeMountField(fields[dash + 2] ?? '') });
  }
  return mounts;
}

/** True when `path` is a mount point (exact match) in this process's mount namespace. */
export async function isMountPoint(path: string): Promise<boolean> {
  return (await listMounts()).some((m) => m.mountPoint === path);
}

/** The kernel escapes space, tab, newline and backslash in mountinfo as octal (`\040`). */
function unescapeMountField(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)));
}

export interface SquashfuseOptions {
  /** Byte offset of the squashfs inside `file` (a SIF's system partition). */
  offset: number;
  /**
   * Let other uids read the mount. Needed when the server runs as root and drops sandboxed programs to other
   * uids; FUSE otherwise refuses every uid but the mounting one. Only root may set it without user_allow_other
   * in /etc/fuse.conf.
   */
  allowOther: boolean;
  timeoutMs: number;
  signal?: AbortSignal;
}

/**
 * Mounts the squashfs at `offset` of `file` read-only on `mountPoint`. squashfuse daemonizes once the mount is
 * up, so when this resolves the mount exists; the daemon serves it until unmounted (it outlives this process,
 * which is why mount points carry an owner marker for reaping). `default_permissions` makes the kernel apply the
 * image's own file modes (a 0700 /root in the image stays closed to the sandbox's user).
 */
export async function mountSquashfs(file: string, mountPoint: string, options: SquashfuseOptions): Promise<void> {
  const opts = ['ro', `offset=${options.offset}`, 'default_permissions', ...(options.allowOther ? ['allow_other'] : [])];
  const result = await run('squashfuse', ['-o', opts.join(','), file, mountPoint], options.timeoutMs, options.signal);
  if (result.missing) throw new RolloutError('sandbox_error', 'squashfuse is not installed (apt-get install squashfuse fuse3): cannot mount .sif images');
  if (!result.ok) throw new RolloutError('sandbox_error', `squashfuse could not mount ${file} at offset ${options.offset}: ${result.error}${mountHint(result.error ?? '')}`);
}

/**
 * What a server that is not root lacks when squashfuse fails the two ways only such a server meets: squashfuse's own
 * words ("fuse: failed to open /dev/fuse: Permission denied", "fusermount3: could not determine username") do not say
 * it is the server's user, nor what to do. Containers often give /dev/fuse to root only and run arbitrary uids
 * without a passwd entry, which the setuid fusermount3 refuses. An image directory needs neither.
 */
function mountHint(error: string): string {
  const uid = process.getuid?.();
  if (uid === undefined || uid === 0) return '';
  if (/\/dev\/fuse: Permission denied/i.test(error)) {
    return ` (the server's user, uid ${uid}, cannot open /dev/fuse: a server that is not root mounts .sif images only with /dev/fuse read-write for it — crw-rw-rw-, as distributions ship it; a container needs it passed in, e.g. --device /dev/fuse — or give an image directory instead of a .sif)`;
  }
  if (/could not determine username/i.test(error)) {
    return ` (fusermount3 needs a passwd entry for the server's user, uid ${uid}, which has none: add one (/etc/passwd, or nss_wrapper) or give an image directory instead of a .sif)`;
  }
  return '';
}

/**
 * Unmounts a FUSE mount: `fusermount3 -u`, then lazily (`-z`, detached now, gone when its last user leaves) if
 * it is busy; as root `umount` is the fallback when fusermount3 is missing. Resolves when nothing is mounted
 * there any more; throws sandbox_error otherwise.
 */
export async function unmountFuse(mountPoint: string): Promise<void> {
  const attempts: [string, string[]][] = [
    ['fusermount3', ['-u', mountPoint]],
    ['fusermount3', ['-uz', mountPoint]],
  ];
  if (process.getuid?.() === 0) attempts.push(['umount', [mountPoint]], ['umount', ['-l', mountPoint]]);
  const errors: string[] = [];
  for (const [command, args] of attempts) {
    const result = await run(command, args, 30_000);
    if (!(await isMountPoint(mountPoint))) return;
    errors.push(`${command} ${args[0]}: ${result.error ?? 'still mounted'}`);
  }
  throw new RolloutError('sandbox_error', `cannot unmount ${mountPoint}: ${errors.join('; ')}`);
}

interface RunResult {
  ok: boolean;
  missing: boolean;
  error: string | undefined;
}

/**
 * Runs a mount tool behind the descriptor closer (fd-closer.ts): squashfuse daemonizes and serves its mount for as long
 * as the image is used, after the server is gone too, so a descriptor the server inherited without close-on-exec (a
 * supervisor's or harness's pipe) would otherwise stay open in it for good — a pipe whose reader then never sees EOF.
 */
function run(command: string, args: string[], timeoutMs: number, signal?: AbortSignal): Promise<RunResult> {
  const [launcher, ...rest] = resolveFdCloser().wrap([], [command, ...args]);
  return new Promise((resolve) => {
    execFile(launcher!, rest, { timeout: timeoutMs, signal, maxBuffer: 256 * 1024, env: { ...process.env, LC_ALL: 'C' } }, (err, _stdout, stderr) => {
      if (err === null) return resolve({ ok: true, missing: false, error: undefined });
      const text = String(stderr).trim().split('\n').slice(0, 3).join('; ') || err.message;
      // ENOENT from spawn itself (no closer), or the closer's 127 (it could not find the tool).
      const code = (err as { code?: unknown }).code;
      resolve({ ok: false, missing: code === 'ENOENT' || code === 127, error: text.slice(0, 600) });
    });
  });
}
