import { constants } from 'node:fs';
import { lstat, mkdir, chown, open, readdir, readlink, type FileHandle } from 'node:fs/promises';
import { join, posix, sep } from 'node:path';
import { RolloutError } from '../errors.js';
import type { DirEntry } from './types.js';

/** Largest file `read` returns; a sandbox can create files of any size, the host must not load them whole. */
export const MAX_READ_BYTES = 32 * 1024 * 1024;

/**
 * Host-side file access to a sandbox's work dir.
 *
 * Why care: the sandboxed program controls the directory's contents and can plant symlinks (`ln -s /etc x`)
 * or FIFOs. Every access is checked lexically (no `..`, no path outside the work dir), opened with O_NOFOLLOW
 * and O_NONBLOCK, and then verified through /proc/self/fd: the file actually opened must lie inside the work
 * dir and be a regular file. A write is truncated only after that check, so a symlink swapped in at the last
 * moment can at worst leave an empty new file outside, never overwrite an existing one.
 */
export class WorkDir {
  constructor(
    /** Real (symlink-free) host path of the work dir. */
    readonly hostRoot: string,
    /** The same directory as the sandbox sees it, e.g. /work. */
    readonly sandboxRoot: string,
    /** Owner to give created files and dirs (the sandbox's dropped uid), if any. */
    private readonly owner?: { uid: number; gid: number },
  ) {}

  /** Maps a sandbox path (absolute under the work dir, or relative to it) to the host; rejects escapes. */
  hostPath(path: string): string {
    if (path.includes('\0')) throw RolloutError.invalid('path', 'contains a NUL byte');
    const abs = posix.normalize(path.startsWith('/') ? path : posix.join(this.sandboxRoot, path));
    const rel = posix.relative(this.sandboxRoot, abs);
    if (rel === '' || rel === '..' || rel.startsWith('../') || posix.isAbsolute(rel)) {
      throw RolloutError.invalid('path', `${path} is outside the work dir ${this.sandboxRoot}`);
    }
    return join(this.hostRoot, ...rel.split('/'));
  }

  async read(path: string): Promise<string> {
    const host = this.hostPath(path);
    const handle = await this.openChecked(path, host, constants.O_RDONLY);
    try {
      const st = await handle.stat();
      if (st.size > MAX_READ_BYTES) throw RolloutError.invalid('path', `${path} is ${st.size} bytes, over the ${MAX_READ_BYTES}-byte limit`);
      return await handle.readFile({ encoding: 'utf8' });
    } finally {
      await handle.close();
    }
  }

  /** Lists a directory inside the work dir (the work dir itself included), without following symlinks. */
  async list(path: string): Promise<DirEntry[]> {
    const abs = posix.normalize(path.startsWith('/') ? path : posix.join(this.sandboxRoot, path));
    const host = abs === this.sandboxRoot ? this.hostRoot : this.hostPath(path);
    const st = await lstat(host).catch(() => undefined);
    if (!st?.isDirectory()) throw RolloutError.invalid('path', `${path} is not a directory`);
    const entries = await readdir(host, { withFileTypes: true });
    const out: DirEntry[] = [];
    for (const e of entries) {
      const type = e.isFile() ? 'file' : e.isDirectory() ? 'dir' : e.isSymbolicLink() ? 'symlink' : 'other';
      const size = type === 'file' ? ((await lstat(join(host, e.name)).catch(() => undefined))?.size ?? 0) : 0;
      out.push({ name: e.name, type, size });
    }
    return out.sort((a, b) => a.name.localeCompare(b.name));
  }

  async write(path: string, content: string): Promise<void> {
    const host = this.hostPath(path);
    await this.makeParents(path, host);
    const handle = await this.openChecked(path, host, constants.O_WRONLY | constants.O_CREAT);
    try {
      await handle.truncate(0);
      await handle.writeFile(content, { encoding: 'utf8' });
      if (this.owner) await handle.chown(this.owner.uid, this.owner.gid);
    } finally {
      await handle.close();
    }
  }

  private async openChecked(path: string, host: string, flags: number): Promise<FileHandle> {
    let handle: FileHandle;
    try {
      handle = await open(host, flags | constants.O_NOFOLLOW | constants.O_NONBLOCK, 0o644);
    } catch (err) {
      throw fileError(path, err);
    }
    try {
      const real = await readlink(`/proc/self/fd/${handle.fd}`);
      if (!real.startsWith(this.hostRoot + sep)) throw RolloutError.invalid('path', `${path} resolves outside the work dir`);
      if (!(await handle.stat()).isFile()) throw RolloutError.invalid('path', `${path} is not a regular file`);
      return handle;
    } catch (err) {
      await handle.close();
      throw err;
    }
  }

  /** Creates missing parent dirs one level at a time, refusing to walk through symlinks or non-dirs. */
  private async makeParents(path: string, host: string): Promise<void> {
    const rel = host.slice(this.hostRoot.length + 1).split(sep).slice(0, -1);
    let dir = this.hostRoot;
    for (const [i, part] of rel.entries()) {
      dir = join(dir, part);
      const st = await lstat(dir).catch(() => undefined);
      if (st === undefined) {
        await mkdir(dir, { mode: 0o755 }).catch((err: unknown) => {
          if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw fileError(path, err);
        });
        if (this.owner) await chown(dir, this.owner.uid, this.owner.gid);
        continue;
      }
      if (!st.isDirectory()) throw RolloutError.invalid('path', `${path}: ${posix.join(...rel.slice(0, i + 1))} is not a directory`);
    }
  }
}

function fileError(path: string, err: unknown): RolloutError {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return new RolloutError('not_found', `no such file: ${path}`, { cause: err });
  if (code === 'ELOOP') return RolloutError.invalid('path', `${path} is a symlink`);
  if (code === 'EISDIR') return RolloutError.invalid('path', `${path} is a directory`);
  if (code === 'ENOTDIR') return RolloutError.invalid('path', `${path}: a parent is not a directory`);
  if (code === 'ENXIO') return RolloutError.invalid('path', `${path} is not a regular file`);
  return RolloutError.from(err, 'sandbox_error');
}
