import { readdirSync, readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { listMounts, unmountFuse } from '../../src/sandboxes/images/fuse-mounts.js';

/**
 * vitest global setup: the test run must leave nothing behind — no image mount, no orphaned process.
 *
 * A SandboxDriver (or SifImageMounts) that is never closed keeps an image mounted for its grace period; when the
 * test file's worker exits meanwhile, the squashfuse daemon and its mount outlive the run (a fresh CI machine was
 * left with one after every run). A sandbox, engine or server a test started and never stopped is orphaned the same
 * way when its worker exits. At the end of the run, mounts that appeared during it are unmounted (by mount point:
 * each is provably this run's), processes that started during it and were orphaned (re-parented to init, outside
 * vitest's own process tree) are killed by pid after a settling time, and the run fails naming them, so the test
 * that leaked is fixed rather than hidden.
 */
export default async function setup(): Promise<() => Promise<void>> {
  const before = new Set((await squashfuseMounts()).map((m) => m.mountPoint));
  const since = startTicks(process.pid) ?? 0;
  return async () => {
    const problems: string[] = [];
    const leaked = (await squashfuseMounts()).filter((m) => !before.has(m.mountPoint));
    if (leaked.length > 0) {
      const unmounted = await Promise.allSettled(leaked.map((m) => unmountFuse(m.mountPoint)));
      const list = leaked.map((m, i) => `${m.mountPoint} (${m.source}${unmounted[i]!.status === 'rejected' ? ', could not be unmounted' : ''})`);
      problems.push(`${leaked.length} image mount(s) (a driver or SifImageMounts not closed): ${list.join(', ')}`);
    }
    // Orphans still exiting (a sandbox killed at the end of its test) get a moment before they count.
    let orphans = orphanedSince(since);
    for (let i = 0; i < 20 && orphans.length > 0; i++) {
      await sleep(250);
      orphans = orphanedSince(since);
    }
    if (orphans.length > 0) {
      for (const o of orphans) {
        try {
          process.kill(o.pid, 'SIGKILL');
        } catch {
          // Gone meanwhile.
        }
      }
      problems.push(`${orphans.length} orphaned process(es), killed: ${orphans.map((o) => `${o.pid} ${o.command}`).join('; ')}`);
    }
    if (problems.length === 0) return;
    // vitest reports an error thrown here but still exits 0: the exit code is what fails the run.
    process.exitCode = 1;
    throw new Error(`the test run left ${problems.join(', and ')}`);
  };
}

async function squashfuseMounts() {
  return (await listMounts()).filter((m) => m.fsType === 'fuse.squashfuse');
}

interface Proc {
  pid: number;
  ppid: number;
  start: number;
  command: string;
}

function readProc(pid: number): Proc | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const command = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ').trim();
    // Kernel threads have no command line: never a test's.
    if (command === '') return undefined;
    return { pid, ppid: Number(fields[1]), start: Number(fields[19]), command: command.slice(0, 160) };
  } catch {
    return undefined;
  }
}

function startTicks(pid: number): number | undefined {
  return readProc(pid)?.start;
}

/** Processes started after `since` (clock ticks since boot) whose tree hangs off init rather than any live parent of theirs. */
function orphanedSince(since: number): Proc[] {
  const procs = new Map<number, Proc>();
  for (const name of readdirSync('/proc')) {
    const pid = Number(name);
    if (!Number.isInteger(pid) || pid <= 1 || pid === process.pid) continue;
    const p = readProc(pid);
    if (p) procs.set(pid, p);
  }
  const orphanRoot = (p: Proc): boolean => p.ppid === 1 && p.start >= since;
  const found: Proc[] = [];
  for (const p of procs.values()) {
    // An orphan, or a process below one: walk up to the first ancestor re-parented to init.
    for (let cur: Proc | undefined = p, hops = 0; cur && hops < 64; cur = procs.get(cur.ppid), hops++) {
      if (orphanRoot(cur)) {
        found.push(p);
        break;
      }
      if (cur.ppid === 1 || cur.ppid === process.pid) break;
    }
  }
  return found;
}
