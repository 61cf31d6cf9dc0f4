import { closeSync, openSync, readFileSync, realpathSync, statSync, unlinkSync, utimesSync, writeSync } from 'node:fs';
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
 * refused. Nothing is ever killed. The file is removed by {@link DirLock.release} (the journal's close).
 *
 * Throws RolloutError('failed_precondition', field journal.dir) naming the directory and the holder.
 */
export class DirLock {
  private released = false;
  private readonly heartbeat: NodeJS.Timeout;

  private constructor(
    private readonly file: string,
    private readonly key: string,
  ) {
    this.heartbeat = setInterval(() => {
      try {
        const now = new Date();
        utimesSync(this.file, now, now);
      } catch {
        // The file is gone (removed by hand): nothing to keep fresh; the journal still works.
      }
    }, LOCK_HEARTBEAT_MS);
    this.heartbeat.unref();
  }

  static acquire(dir: string): DirLock {
    const key = realpathSync(dir);
    const file = join(dir, 'server.lock');
    const refuse = (holder: string): RolloutError =>
      new RolloutError('failed_precondition', `journal.dir: ${dir} is in use by another server (${holder}); one journal directory serves one server at a time`, { field: 'journal.dir' });
    if (heldHere.has(key)) throw refuse(`this process, pid ${process.pid}`);
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        const fd = openSync(file, 'wx', 0o644);
        try {
          writeSync(fd, JSON.stringify({ pid: process.pid, host: hostname(), startedAt: new Date().toISOString() } satisfies Holder) + '\n');
        } finally {
          closeSync(fd);
        }
        heldHere.add(key);
        return new DirLock(file, key);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
      const holder = readHolder(file);
      if (holder && !isStale(holder, file)) {
        const where = holder.host === hostname() ? `pid ${holder.pid}` : `pid ${holder.pid} on host ${holder.host}, alive less than ${LOCK_STALE_MS / 1000} s ago`;
        throw refuse(`${where}, since ${holder.startedAt}`);
      }
      // Left by a holder that died: removed, then created again with O_EXCL (a racing server gets EEXIST and checks).
      try {
        unlinkSync(file);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
    }
    throw refuse(`another server took ${file} while this one was starting`);
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    clearInterval(this.heartbeat);
    heldHere.delete(this.key);
    try {
      unlinkSync(this.file);
    } catch {
      // already gone: nothing to release
    }
  }
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
