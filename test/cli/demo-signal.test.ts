import { execFileSync, spawn } from 'node:child_process';
import { readdirSync, readFileSync, rmdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { eventually } from '../support/wait.js';

/**
 * `rollout demo` stopped by a signal mid-run: it releases what it started — the sandboxes (their cgroups) and the
 * image's squashfuse mount, the server and the engine — before it exits 128 + the signal's number.
 */

const root = fileURLToPath(new URL('../../', import.meta.url));
const CGROUP_ROOTS = ['/sys/fs/cgroup/pids/rollout-sandboxes', '/sys/fs/cgroup/memory/rollout-sandboxes'];

/** The sandbox cgroups process `pid` owns (named `<pid>-...` under each controller's root). */
function cgroupsOf(pid: number): string[] {
  return CGROUP_ROOTS.flatMap((r) => {
    try {
      return readdirSync(r).filter((d) => d.startsWith(`${pid}-`)).map((d) => join(r, d));
    } catch {
      return [];
    }
  });
}

/** The image mounts process `pid` owns (`<tmpdir>/rollout-images-<uid>/<pid>-...`). */
function mountsOf(pid: number): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => new RegExp(`/rollout-images-\\d+/${pid}-`).test(m));
}

/** Removes what a demo that failed this test left (its own mounts and cgroups only), so the run's leftover check stays about other tests. */
function cleanUp(pid: number): void {
  for (const m of mountsOf(pid)) {
    try {
      execFileSync('fusermount3', ['-u', m]);
    } catch {
      execFileSync('umount', ['-l', m]);
    }
    rmSync(join(m, '..'), { recursive: true, force: true });
  }
  for (const cg of cgroupsOf(pid)) {
    for (const d of execFileSync('find', [cg, '-type', 'd']).toString().trim().split('\n').reverse()) {
      try {
        rmdirSync(d);
      } catch {
        /* a process still in it: the leftover check names it */
      }
    }
  }
}

async function interruptMidRun(signal: 'SIGINT' | 'SIGTERM'): Promise<{ code: number | null; left: { mounts: string[]; cgroups: string[] }; out: string }> {
  const child = spawn(process.execPath, ['bin/rollout.js', 'demo', '--groups', '4', '--group-size', '4', '--latency-ms', '300'], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' },
  });
  const pid = child.pid!;
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  try {
    await eventually(() => cgroupsOf(pid).length > 0 && mountsOf(pid).length > 0, 'the demo\u2019s sandboxes to run', 60_000);
    expect(out).not.toMatch(/trajectories in/); // still running
    child.kill(signal);
    const code = await exited;
    return { code, left: { mounts: mountsOf(pid), cgroups: cgroupsOf(pid) }, out };
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
    cleanUp(pid);
  }
}

describe('`rollout demo` interrupted mid-run', () => {
  // Regression: no signal handler: Ctrl-C killed node before its cleanup, leaving the image mounted and the cgroups behind.
  it('SIGINT: releases its sandboxes and image mount, then exits 130', async () => {
    const { code, left, out } = await interruptMidRun('SIGINT');
    expect({ code, left }).toEqual({ code: 130, left: { mounts: [], cgroups: [] } });
    expect(out).toMatch(/demo: stopped by a signal after \d+\/16 trajectories/);
  }, 120_000);

  it('SIGTERM: the same, exit 143', async () => {
    const { code, left } = await interruptMidRun('SIGTERM');
    expect({ code, left }).toEqual({ code: 143, left: { mounts: [], cgroups: [] } });
  }, 120_000);
});
