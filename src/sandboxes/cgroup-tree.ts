import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, rmdir } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/** How long a kill waits for a cgroup's processes to disappear before it gives up (they are SIGKILLed). */
const EMPTY_WAIT_MS = 10_000;

/**
 * One cgroup directory and everything below it, in any hierarchy (v1 controller or v2). Why a tree walk and not
 * `cgroup.kill`: v1 has none, so the processes listed in `cgroup.procs` are SIGKILLed, pass after pass, until the
 * whole subtree is empty (a process forking while we read is caught by the next pass; pids.max bounds the race).
 * Only processes inside this server's own cgroups are ever signalled, never anything matched by name.
 */
export class CgroupTree {
  constructor(readonly path: string) {}

  get procs(): string {
    return join(this.path, 'cgroup.procs');
  }

  /** Creates the cgroup (and missing parents); a parent removed concurrently by a sibling's cleanup is re-made. */
  async make(): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        await mkdir(this.path, { recursive: true });
        return;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || attempt >= 3) throw err;
      }
    }
  }

  /** SIGKILLs every process in the subtree until none is left (or the wait runs out). */
  async kill(): Promise<void> {
    const deadline = Date.now() + EMPTY_WAIT_MS;
    for (;;) {
      const pids = await this.pids();
      if (pids.length === 0) return;
      for (const pid of pids) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // Already gone.
        }
      }
      if (Date.now() > deadline) return;
      await sleep(5);
    }
  }

  /**
   * Kills the subtree's processes and removes its cgroups bottom-up, retrying while the kernel still counts
   * exiting processes (rmdir says EBUSY). Idempotent; never throws; returns whether the cgroup is gone.
   */
  async remove(): Promise<boolean> {
    const deadline = Date.now() + EMPTY_WAIT_MS;
    for (;;) {
      await this.kill();
      await removeDirs(this.path, 1);
      if (!existsSync(this.path)) return true;
      if (Date.now() > deadline) return false;
      await sleep(10);
    }
  }

  /** Removes the cgroup when no process is left in it; one attempt, so a busy cgroup costs nothing. */
  async removeIfEmpty(): Promise<void> {
    await removeDirs(this.path, 1);
  }

  private async pids(): Promise<number[]> {
    const out: number[] = [];
    const walk = async (dir: string): Promise<void> => {
      const text = await readFile(join(dir, 'cgroup.procs'), 'utf8').catch(() => '');
      for (const line of text.split('\n')) if (line) out.push(Number(line));
      const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
      for (const e of entries) if (e.isDirectory()) await walk(join(dir, e.name));
    };
    await walk(this.path);
    return out;
  }
}

/** rmdir children first (cgroup dirs hold only control files, which rmdir ignores); EBUSY (still in use) is left. */
async function removeDirs(dir: string, attempts = 50): Promise<void> {
  const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
  for (const e of entries) if (e.isDirectory()) await removeDirs(join(dir, e.name), attempts);
  // A just-killed process leaves its cgroup a moment after it is reaped: retry EBUSY briefly.
  for (let attempt = 0; attempt < attempts; attempt++) {
    try {
      await rmdir(dir);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EBUSY' || attempt + 1 >= attempts) return;
      await sleep(10);
    }
  }
}

/** A process's start time (field 22 of /proc/PID/stat), which tells a reused pid from the process we knew. */
export function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

/** Whether an owner named `<pid>-<starttime>` (see CgroupManager) is still the running process it names. */
export function ownerIsAlive(owner: string): boolean {
  const match = /^(\d+)-(\d+)$/.exec(owner);
  if (!match) return false;
  return processStartTime(Number(match[1])) === match[2];
}
