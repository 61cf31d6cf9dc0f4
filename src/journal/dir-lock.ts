import { closeSync, fstatSync, openSync, readFileSync, realpathSync, statSync, unlinkSync, utimesSync, writeSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { RolloutError } from '../errors.js';

/** How often a holder touches its lock file (its mtime says it is alive to servers on other hosts). */
export const LOCK_HEARTBEAT_MS = 10_000;
/** A lock from another host whose file has not been touched for this long is stale (its holder stopped beating). */
export const LOCK_STALE_MS = 6 * LOCK_HEARTBEAT_MS;

/** Directories (real paths) whose lock this process holds: a second open in the same process is refused too. */
const heldHere = new Set<string>();

/** What a lock file records about its holder. */
interface Holder {
  pid: number;
  host: string;
  startedAt: string;
}

/**
 * One server per journal directory, for the holder's life: `dir/server.lock`, created with O_EXCL, records the
 * holder's pid and host. Node has no flock(2) and no maintained package for it is installed, so a lock file left by a
 * holder that died (`kill -9`) is recognized instead: on the same host, a recorded pid that no longer runs (or is this
 * process's own pid but not held here, as after a container restart that reuses pid 1) is stale and taken over. A
 * holder on another host cannot be asked, so the holder touches the file every {@link LOCK_HEARTBEAT_MS}: one from
 * another host untouched for {@link LOCK_STALE_MS} is stale too (a pod rescheduled under another name, a Slurm job
 * requeued on another node after a crash: the journal must not stay locked by a server that is gone); a fresh one is
 * refused. Nothing is ever killed. The file is removed by {@link DirLock.release} (the journal's close). While held, a
 * lock file removed by hand is taken again ({@link DirLock.check}, and by the heartbeat), and one another server took
 * meanwhile is reported, never removed.
 *
 * Throws RolloutError('failed_precondition', field journal.dir) naming the directory and the holder.
 */
export class DirLock {
  private released = false;
  private ino: number;
  private readonly heartbeat: NodeJS.Timeout;

  private constructor(
    private readonly dir: string,
    private readonly file: string,
    private readonly key: string,
    /**
     * The lock file this holder created, kept open so its inode cannot be reused: a file at its path with another
     * inode is not this holder's.
     */
    private fd: number,
  ) {
    this.ino = fstatSync(fd).ino;
    this.heartbeat = setInterval(() => {
      if (this.check() !== undefined) return; // another server's: not ours to touch
      try {
        const now = new Date();
        utimesSync(this.file, now, now);
      } catch {
        // Gone meanwhile: taken again by the next check.
      }
    }, LOCK_HEARTBEAT_MS);
    this.heartbeat.unref();
  }

  static acquire(dir: string): DirLock {
    const key = realpathSync(dir);
    const file = join(dir, 'server.lock');
    const refuse = (holder: string): RolloutError => new RolloutError('failed_precondition', `journal.dir: ${inUse(dir, holder)}`, { field: 'journal.dir' });
    if (heldHere.has(key)) throw refuse(`this process, pid ${process.pid}`);
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        const fd = create(file);
        heldHere.add(key);
        return new DirLock(dir, file, key, fd);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
      const holder = readHolder(file);
      if (holder && !isStale(holder, file)) throw refuse(describeHolder(holder));
      // Left by a holder that died: removed, then created again with O_EXCL (a racing server gets EEXIST and checks).
      try {
        unlinkSync(file);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
    }
    throw refuse(`another server took ${file} while this one was starting`);
  }

  /**
   * Undefined while this holder still holds the lock; else why not (the directory is in use by another server: its lock
   * file was removed, and that server took it). A lock file removed by hand (nobody else took it) is created again, so a
   * second server is still refused. A few system calls: for each write a client is answered on.
   */
  check(): string | undefined {
    if (this.released) return undefined;
    try {
      if (statSync(this.file).ino === this.ino) return undefined;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') return undefined; // cannot tell: not taken from anyone
      try {
        const fd = create(this.file);
        closeSync(this.fd);
        this.fd = fd;
        this.ino = fstatSync(fd).ino;
        return undefined;
      } catch (e) {
        // The directory is gone (the journal sees its data file gone), or another server took the file just now.
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') return undefined;
      }
    }
    const holder = readHolder(this.file);
    return inUse(this.dir, holder ? describeHolder(holder) : 'its lock file was replaced');
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    clearInterval(this.heartbeat);
    heldHere.delete(this.key);
    try {
      // Only this holder's file: one another server took meanwhile is that server's.
      if (statSync(this.file).ino === this.ino) unlinkSync(this.file);
    } catch {
      // already gone: nothing to release
    }
    closeSync(this.fd);
  }
}

/** Creates the lock file (O_EXCL) naming this process; returns it open. Throws EEXIST when there is one. */
function create(file: string): number {
  const fd = openSync(file, 'wx', 0o644);
  try {
    writeSync(fd, JSON.stringify({ pid: process.pid, host: hostname(), startedAt: new Date().toISOString() } satisfies Holder) + '\n');
    return fd;
  } catch (err) {
    closeSync(fd);
    throw err;
  }
}

function inUse(dir: string, holder: string): string {
  return `${dir} is in use by another server (${holder}); one journal directory serves one server at a time`;
}

function describeHolder(holder: Holder): string {
  const where = holder.host === hostname() ? `pid ${holder.pid}` : `pid ${holder.pid} on host ${holder.host}, alive less than ${LOCK_STALE_MS / 1000} s ago`;
  return `${where}, since ${holder.startedAt}`;
}

/** The holder a lock file names; undefined when it cannot be read as one (half-written: treated as stale). */
function readHolder(file: string): Holder | undefined {
  try {
    const h = JSON.parse(readFileSync(file, 'utf8')) as Partial<Holder>;
    if (typeof h.pid !== 'number' || typeof h.host !== 'string') return undefined;
    return { pid: h.pid, host: h.host, startedAt: String(h.startedAt ?? 'an unknown time') };
  } catch {
    return undefined;
  }
}

function isStale(holder: Holder, file: string): boolean {
  if (holder.host !== hostname()) {
    try {
      return Date.now() - statSync(file).mtimeMs > LOCK_STALE_MS;
    } catch {
      return true; // gone meanwhile
    }
  }
  if (holder.pid === process.pid) return true; // not held here (checked first): a previous life of this pid
  try {
    process.kill(holder.pid, 0); // signal 0: only asks whether the process exists
    return false;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ESRCH';
  }
}
