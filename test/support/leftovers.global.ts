import { randomUUID } from 'node:crypto';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { listMounts, unmountFuse } from '../../src/sandboxes/images/fuse-mounts.js';

/** Set for the whole run: every worker and every process a test starts with the inherited environment carries it. */
const MARKER = 'ROLLOUT_TEST_RUN';

/**
 * vitest global setup: the test run must leave nothing behind — no image mount, no orphaned process, no temporary
 * file.
 *
 * A SandboxDriver (or SifImageMounts) that is never closed keeps an image mounted for its grace period; when the
 * test file's worker exits meanwhile, the squashfuse daemon and its mount outlive the run (a fresh CI machine was
 * left with one after every run). An engine, server or helper a test started and never stopped is orphaned the same
 * way when its worker exits. What is this run's is told by {@link MARKER} in a process's environment (a unique id per
 * run), so a concurrent run or a demo beside it is never touched: at the end, mounts served by a squashfuse daemon
 * of this run are unmounted, this run's processes still alive outside vitest's own tree after a settling time are
 * killed by pid, and the run fails naming them, so the test that leaked is fixed rather than hidden. (Sandboxes are
 * launched with a clean environment, so a leaked bwrap is not seen here: the sandbox suites check those themselves.)
 *
 * Temporary files: the run gets a directory of its own and every process it starts finds it as TMPDIR (os.tmpdir(),
 * Python's tempfile, pytest's base directory, mktemp), so what a test created and did not remove is told from
 * everything else in /tmp. At the end, whatever is left in it except {@link KEPT} is named, the run fails, and the
 * directory is removed either way (test runs had left dozens of empty sandbox roots and soak work directories).
 */
export default async function setup(): Promise<() => Promise<void>> {
  const run = randomUUID();
  process.env[MARKER] = run;
  const runTmp = mkdtempSync(join(tmpdir(), 'rollout-test-run-'));
  // Like /tmp itself (sticky, open to all): a sandbox or helper running as another user finds it as it finds /tmp.
  chmodSync(runTmp, 0o1777);
  process.env.TMPDIR = runTmp;
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
    const files = leftFiles(runTmp);
    try {
      rmSync(runTmp, { recursive: true, force: true, maxRetries: 3 });
    } catch (err) {
      problems.push(`a TMPDIR that could not be removed: ${runTmp} (${String(err)})`);
    }
    if (files.length > 0) problems.push(`${files.length} temporary file(s) or directories in TMPDIR, removed: ${files.join(', ')}`);
    if (problems.length === 0) return;
    // vitest reports an error thrown here but still exits 0: the exit code is what fails the run.
    process.exitCode = 1;
    throw new Error(`the test run left ${problems.join(', and ')}`);
  };
}

/**
 * What may stay in the run's TMPDIR, each for its reason: tsx's transform cache (`tsx-<uid>`: a cache, written by
 * every process started through tsx) and the image mount root servers share (`rollout-images-<uid>`, kept between
 * servers by design) when it is empty.
 */
const KEPT: readonly { name: RegExp; onlyEmpty: boolean }[] = [
  { name: /^tsx-\d+$/, onlyEmpty: false },
  { name: /^rollout-images-\w+$/, onlyEmpty: true },
];

/** The entries left in `dir` (one level; a directory's entry count in brackets), {@link KEPT} excepted. */
function leftFiles(dir: string): string[] {
  const left: string[] = [];
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    let entries: number | undefined;
    try {
      entries = statSync(path).isDirectory() ? readdirSync(path).length : undefined;
    } catch {
      // Unreadable (a sandbox's own permissions) or gone meanwhile: reported as it is.
    }
    const kept = KEPT.find((k) => k.name.test(name));
    if (kept && (!kept.onlyEmpty || entries === 0)) continue;
    left.push(entries === undefined ? name : `${name}/ (${entries} entries)`);
  }
  return left;
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
