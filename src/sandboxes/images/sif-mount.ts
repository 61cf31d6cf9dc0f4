import { lstat, mkdir, mkdtemp, readdir, readFile, realpath, rm, rmdir, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RolloutError, throwIfAborted } from '../../errors.js';
import { silentLogger, type Logger } from '../../observability/logger.js';
import { isMountPoint, mountSquashfs, unmountFuse } from './fuse-mounts.js';
import { DirectoryImages, type ImageMounts, type MountedImage } from './image-mounts.js';
import { processStartTime } from './process-identity.js';
import { readSifFile } from './sif.js';

export interface SifImageMountsOptions {
  /**
   * Directory of this server's mount points; default `<tmpdir>/rollout-images-<uid>`. It must be a real directory
   * owned by this uid and closed to others (0700): anything else is refused, since `reap()` acts on what is in it.
   */
  mountRoot?: string;
  /** How long an image stays mounted after its last holder releases it, ms (a hot image skips remounting); default 5000; 0 unmounts at once. */
  graceMs?: number;
  /** Bound on one squashfuse mount, ms; default 30000. */
  mountTimeoutMs?: number;
  logger?: Logger;
}

/** What marks a directory under the mount root as one of ours, and whose. */
interface OwnerMarker {
  kind: 'rollout-image-mount';
  pid: number;
  /** The owner's start time (/proc/<pid>/stat field 22): a reused pid is not mistaken for it. */
  startTime: string;
  image: string;
}

const MARKER = 'owner.json';
const MOUNT_POINT = 'root';

interface Entry {
  readonly key: string;
  readonly image: string;
  /** `<mountRoot>/<pid>-XXXXXX`: holds the marker and the mount point. */
  dir: string | undefined;
  refs: number;
  ready: Promise<string>;
  state: 'mounting' | 'mounted' | 'unmounting';
  timer: NodeJS.Timeout | undefined;
}

/**
 * ImageMounts for directory images (used in place) and Singularity images (.sif): a SIF's primary system
 * partition is mounted read-only with squashfuse at its offset, once per image file — keyed by real path, device,
 * inode, size and mtime, so a rebuilt image is a new mount — and shared by every holder. The last release
 * unmounts it after `graceMs`.
 *
 * Invariants: concurrent acquires of one image mount it once; every acquire that resolves is matched by exactly
 * one unmount after its release (releases are idempotent); mount points live only under the mount root, each in
 * a directory with an owner marker written before mounting, so `reap()` can prove what a dead predecessor left
 * and never touches a live server's mounts or anything unmarked. When the server runs as root the mount allows
 * other uids (sandboxed programs run as dropped uids) and the image's own file modes are enforced.
 *
 * @example
 * const images = new SifImageMounts({ logger });
 * await images.reap();
 * const image = await images.acquire('.cache/images/python.sif', signal);
 * try { bind(image.root, '/'); } finally { await image.release(); }
 */
export class SifImageMounts implements ImageMounts {
  readonly mountRoot: string;
  private readonly graceMs: number;
  private readonly mountTimeoutMs: number;
  private readonly log: Logger;
  private readonly directories = new DirectoryImages();
  private readonly entries = new Map<string, Entry>();
  private readonly pending = new Set<Promise<void>>();
  private rootReady: Promise<void> | undefined;

  constructor(options: SifImageMountsOptions = {}) {
    this.mountRoot = options.mountRoot ?? join(tmpdir(), `rollout-images-${process.getuid?.() ?? 'user'}`);
    this.graceMs = options.graceMs ?? 5_000;
    this.mountTimeoutMs = options.mountTimeoutMs ?? 30_000;
    this.log = (options.logger ?? silentLogger()).child({ component: 'image-mounts' });
  }

  async acquire(image: string, signal?: AbortSignal): Promise<MountedImage> {
    throwIfAborted(signal);
    if (!image.endsWith('.sif')) return this.directories.acquire(image, signal);
    const real = await realpath(image).catch((err: Error) => {
      throw new RolloutError('sandbox_error', `image ${image} cannot be used: ${err.message}`, { cause: err });
    });
    const st = await stat(real);
    if (!st.isFile()) throw new RolloutError('sandbox_error', `image ${image} is not a file`);
    const key = `${real}\0${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}`;
    let entry = this.entries.get(key);
    if (!entry) {
      const created: Entry = { key, image: real, dir: undefined, refs: 0, ready: Promise.resolve(''), state: 'mounting', timer: undefined };
      created.ready = this.mount(created);
      created.ready.catch(() => {
        if (this.entries.get(key) === created) this.entries.delete(key);
      });
      this.entries.set(key, created);
      entry = created;
    }
    entry.refs++;
    clearTimeout(entry.timer);
    entry.timer = undefined;
    const held = entry;
    let root: string;
    try {
      root = await abortable(held.ready, signal);
    } catch (err) {
      held.refs--;
      void this.whenIdle(held);
      throw RolloutError.from(err, 'sandbox_error');
    }
    let released = false;
    return {
      root,
      release: async () => {
        if (released) return;
        released = true;
        held.refs--;
        await this.whenIdle(held);
      },
    };
  }

  /**
   * Unmounts and removes what a dead predecessor left under the mount root: directories whose marker names a
   * process that no longer exists (pid and start time). Unmarked entries and live owners' mounts are left alone.
   */
  async reap(): Promise<{ removed: number }> {
    let names: string[];
    try {
      await this.ensureRoot();
      names = await readdir(this.mountRoot);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { removed: 0 };
      throw RolloutError.from(err, 'sandbox_error');
    }
    let removed = 0;
    for (const name of names) {
      const dir = join(this.mountRoot, name);
      const marker = await readMarker(dir);
      if (!marker || processStartTime(marker.pid) === marker.startTime) continue;
      try {
        await this.removeMountDir(dir);
        removed++;
        this.log.info({ dir, image: marker.image, ownerPid: marker.pid }, 'reaped a stale image mount');
      } catch (err) {
        this.log.warn({ dir, err }, 'could not reap a stale image mount');
      }
    }
    return { removed };
  }

  /** Unmounts every image now, held or idle (server shutdown); later acquires mount afresh. */
  async close(): Promise<void> {
    const entries = [...this.entries.values()];
    this.entries.clear();
    for (const entry of entries) clearTimeout(entry.timer);
    await Promise.allSettled(entries.map(async (entry) => this.unmount(entry, await entry.ready)));
    await Promise.allSettled([...this.pending]);
  }

  private async mount(entry: Entry): Promise<string> {
    const started = performance.now();
    const partition = await readSifFile(entry.image);
    if (partition.arch !== undefined && partition.arch !== process.arch) {
      throw new RolloutError('sandbox_error', `image ${entry.image} is built for ${partition.arch}, this machine is ${process.arch}`);
    }
    await this.ensureRoot();
    const dir = await mkdtemp(join(this.mountRoot, `${process.pid}-`));
    entry.dir = dir;
    const mountPoint = join(dir, MOUNT_POINT);
    try {
      const marker: OwnerMarker = { kind: 'rollout-image-mount', pid: process.pid, startTime: processStartTime(process.pid) ?? '', image: entry.image };
      await writeFile(join(dir, MARKER), JSON.stringify(marker));
      await mkdir(mountPoint);
      await mountSquashfs(entry.image, mountPoint, { offset: partition.offset, allowOther: process.getuid?.() === 0, timeoutMs: this.mountTimeoutMs });
      if (!(await isMountPoint(mountPoint))) throw new RolloutError('sandbox_error', `squashfuse reported success but ${mountPoint} is not mounted`);
    } catch (err) {
      await this.removeMountDir(dir).catch((cleanupErr: unknown) => this.log.warn({ dir, err: cleanupErr }, 'could not clean up a failed mount'));
      throw err;
    }
    entry.state = 'mounted';
    this.log.debug({ image: entry.image, mountPoint, ms: Math.round(performance.now() - started) }, 'mounted image');
    return mountPoint;
  }

  /** After a holder left: unmount at once (grace 0) or after the grace period, unless someone holds it again. */
  private whenIdle(entry: Entry): Promise<void> {
    if (entry.refs > 0) return Promise.resolve();
    return entry.ready.then(
      (mountPoint) => {
        if (entry.refs > 0 || entry.state !== 'mounted' || entry.timer) return;
        if (this.graceMs === 0) return this.unmount(entry, mountPoint);
        entry.timer = setTimeout(() => {
          entry.timer = undefined;
          if (entry.refs === 0) void this.unmount(entry, mountPoint);
        }, this.graceMs);
        entry.timer.unref();
      },
      () => undefined,
    );
  }

  private unmount(entry: Entry, _mountPoint: string): Promise<void> {
    if (entry.state !== 'mounted' || entry.dir === undefined) return Promise.resolve();
    entry.state = 'unmounting';
    if (this.entries.get(entry.key) === entry) this.entries.delete(entry.key);
    const dir = entry.dir;
    const done = this.removeMountDir(dir).then(
      () => this.log.debug({ image: entry.image, dir }, 'unmounted image'),
      (err: unknown) => this.log.warn({ image: entry.image, dir, err }, 'could not unmount image; reap() will retry after a restart'),
    );
    this.pending.add(done);
    void done.finally(() => this.pending.delete(done));
    return done;
  }

  /** Unmounts `<dir>/root` if mounted, then removes the marker and both directories (rmdir: never recursive into a mount). */
  private async removeMountDir(dir: string): Promise<void> {
    const mountPoint = join(dir, MOUNT_POINT);
    if (await isMountPoint(mountPoint)) await unmountFuse(mountPoint);
    await rmdir(mountPoint).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
    });
    await rm(join(dir, MARKER), { force: true });
    await rmdir(dir);
  }

  private ensureRoot(): Promise<void> {
    this.rootReady ??= (async () => {
      await mkdir(this.mountRoot, { recursive: true, mode: 0o700 });
      const st = await lstat(this.mountRoot);
      const uid = process.getuid?.();
      if (!st.isDirectory() || (uid !== undefined && st.uid !== uid) || (st.mode & 0o077) !== 0) {
        throw new RolloutError('sandbox_error', `image mount root ${this.mountRoot} is not a directory private to uid ${String(uid)}: refusing to use it`);
      }
    })();
    this.rootReady.catch(() => (this.rootReady = undefined));
    return this.rootReady;
  }
}

async function readMarker(dir: string): Promise<OwnerMarker | undefined> {
  try {
    const parsed = JSON.parse(await readFile(join(dir, MARKER), 'utf8')) as Partial<OwnerMarker>;
    if (parsed.kind !== 'rollout-image-mount' || typeof parsed.pid !== 'number' || typeof parsed.startTime !== 'string') return undefined;
    return parsed as OwnerMarker;
  } catch {
    return undefined;
  }
}

/** `promise`, or the signal's reason as soon as it fires (the promise itself goes on). */
function abortable<T>(promise: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return promise;
  throwIfAborted(signal);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(RolloutError.from(signal.reason, 'cancelled'));
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err instanceof Error ? err : new Error(String(err)));
      },
    );
  });
}
