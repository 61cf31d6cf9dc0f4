import { randomUUID } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { listMounts, unmountFuse } from '../../src/sandboxes/images/fuse-mounts.js';

/** Set for the whole run: every worker and every process a test starts with the inherited environment carries it. */
const MARKER = 'ROLLOUT_TEST_RUN';

/**
 * vitest global setup: the test run must leave nothing behind — no image mount, no orphaned process.
 *
 * A SandboxDriver (or SifImageMounts) that is never closed keeps an image mounted for its grace period; when the
 * test file's worker exits meanwhile, the squashfuse daemon and its mount outlive the run (a fresh CI machine was
 * left with one after every run). An engine, server or helper a test started and never stopped is orphaned the same
 * way when its worker exits. What is this run's is told by {@link MARKER} in a process's environment (a unique id per
 * run), so a concurrent run or a demo beside it is never touched: at the end, mounts served by a squashfuse daemon
 * of this run are unmounted, this run's processes still alive outside vitest's own tree after a settling time are
 * killed by pid, and the run fails naming them, so the test that leaked is fixed rather than hidden. (Sandboxes are
 * launched with a clean environment, so a leaked bwrap is not seen here: the sandbox suites check those themselves.)
 */
export default async function setup(): Promise<() => Promise<void>> {
  const run = randomUUID();
  process.env[MARKER] = run;
  const before = new Set((await squashfuseMounts()).map((m) => m.mountPoint));
  return async () => {
    const problems: string[] = [];
    const daemons = ours(run).filter((p) => p.command.startsWith('squashfuse '));
    const leaked = (await squashfuseMounts()).filter((m) => !before.has(m.mountPoint) && daemons.some((d) => d.command.endsWith(` ${m.mountPoint}`)));
    if (leaked.length > 0) {
      const unmounted = await Promise.allSettled(leaked.map((m) => unmountFuse(m.mountPoint)));
      const list = leaked.map((m, i) => `${m.mountPoint} (${m.source}${unmounted[i]!.status === 'rejected' ? ', could not be unmounted' : ''})`);
      problems.push(`${leaked.length} image mount(s) (a driver or SifImageMounts not closed): ${list.join(', ')}`);
    }
    // Processes still exiting (an engine stopped at the end of its file, an unmounted image's daemon) get a moment.
    let orphans = ours(run);
    for (let i = 0; i < 40 && orphans.length > 0; i++) {
      await sleep(250);
      orphans = ours(run);
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
  command: string;
}

/** This run's processes (its marker in their environment) that are not vitest's own (this process and below). */
function ours(run: string): Proc[] {
  const procs = new Map<number, Proc>();
  const marked = new Set<number>();
  const needle = `\0${MARKER}=${run}\0`;
  for (const name of readdirSync('/proc')) {
    const pid = Number(name);
    if (!Number.isInteger(pid) || pid <= 1) continue;
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const command = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ').trim();
      procs.set(pid, { pid, ppid: Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]), command: command.slice(0, 200) });
      if (`\0${readFileSync(`/proc/${pid}/environ`, 'latin1')}`.includes(needle)) marked.add(pid);
    } catch {
      // Gone meanwhile, or not ours to read.
    }
  }
  const inVitest = (pid: number): boolean => {
    for (let cur = procs.get(pid), hops = 0; cur && hops < 64; cur = procs.get(cur.ppid), hops++) if (cur.pid === process.pid) return true;
    return false;
  };
  return [...marked].filter((pid) => !inVitest(pid)).map((pid) => procs.get(pid)!);
}
