import { execFile } from 'node:child_process';
import { lstat, unlink } from 'node:fs/promises';
import { RolloutError } from '../errors.js';

/**
 * Removes a sandbox's work dir, whatever the sandboxed program did to it:
 * - trees deeper than PATH_MAX (e.g. 40 levels of 250-character names), which path-based removal (Node's `fs.rm`)
 *   cannot reach: coreutils `rm` walks with fts over directory fds (openat/unlinkat), so depth is no limit;
 * - directories made unreadable or read-only (`chmod 000`, `chmod 555`) and read-only files, which stop a non-root
 *   owner: a failed first pass is followed by `chmod -R u+rwX` and a second `rm`;
 * - files owned by other uids, FIFOs, sockets and devices: unlinked like any entry;
 * - symlinks (also ones pointing outside the tree): removed, never followed — neither `rm -r` nor `chmod -R`
 *   (physical walk, its default) traverses them;
 * - mount points inside the tree: `--one-file-system` refuses to descend into another file system, so a mount
 *   left inside never gets its contents deleted; the removal then fails loudly instead.
 *
 * Invariants: `dir` itself is never followed when it is a symlink (the link is unlinked); a missing `dir` is
 * success; on failure the error is a RolloutError('internal') naming the directory and what rm said.
 */
export async function removeTree(dir: string): Promise<void> {
  const st = await lstat(dir).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return undefined;
    throw new RolloutError('internal', `cannot remove ${dir}: ${err.message}`, { cause: err });
  });
  if (!st) return;
  if (!st.isDirectory()) {
    await unlink(dir).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw new RolloutError('internal', `cannot remove ${dir}: ${err.message}`, { cause: err });
    });
    return;
  }
  const first = await run('rm', ['-rf', '--one-file-system', '--', dir]);
  if (first.ok && !(await exists(dir))) return;
  // A non-root owner cannot list a 000 directory or unlink inside a 555 one: give the owner its rights back.
  await run('chmod', ['-R', 'u+rwX', '--', dir]);
  const second = await run('rm', ['-rf', '--one-file-system', '--', dir]);
  if (second.ok && !(await exists(dir))) return;
  throw new RolloutError('internal', `cannot remove ${dir}: ${firstLines(second.stderr || first.stderr) || 'rm left it on disk'}`);
}

async function exists(path: string): Promise<boolean> {
  return lstat(path).then(
    () => true,
    () => false,
  );
}

function run(command: string, args: string[]): Promise<{ ok: boolean; stderr: string }> {
  return new Promise((resolve) => {
    execFile(command, args, { maxBuffer: 1024 * 1024, env: { ...process.env, LC_ALL: 'C' } }, (err, _stdout, stderr) => {
      resolve({ ok: err === null, stderr: String(stderr) });
    });
  });
}

function firstLines(text: string): string {
  return text.split('\n').filter(Boolean).slice(0, 3).join('; ').slice(0, 600);
}
