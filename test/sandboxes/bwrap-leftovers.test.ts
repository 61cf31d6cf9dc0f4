import { spawn } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { abortReason } from '../../src/errors.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import { cgroupsMatching, closeAfterAll, findHostProcessesWithEnv, mountsMatching, processesInOurCgroups, testSpec, waitFor } from './helpers.js';

const driver = closeAfterAll(new BubblewrapDriver());
const TAG = 'SBX_LEFTOVER_TAG';

function legacyDirs(): string[] {
  return readdirSync(tmpdir()).filter((n) => n.startsWith('rollout-sbx-'));
}

/** One sandbox's life, picked by `i`: hung command killed by stop, timeout, abort mid-exec, abort mid-start, hostile contents. */
async function lifeOf(i: number, token: string): Promise<void> {
  const env = { [TAG]: token };
  const kind = i % 5;
  if (kind === 3) {
    const controller = new AbortController();
    const starting = driver.start(testSpec({ maxProcesses: 16, memoryMb: 128 }), controller.signal);
    setTimeout(() => controller.abort(abortReason('cancelled', 'test')), i % 7);
    const s = await starting.catch(() => undefined);
    await s?.stop();
    return;
  }
  const s = await driver.start(testSpec({ maxProcesses: 16, memoryMb: 128 }));
  try {
    if (kind === 0) {
      void s.exec(['sh', '-c', 'sleep 300 & sleep 300'], { env }).catch(() => undefined);
      await new Promise((r) => setTimeout(r, 50));
    } else if (kind === 1) {
      await s.exec(['sh', '-c', 'setsid sleep 300 & exec sleep 300'], { env, timeoutMs: 300 });
    } else if (kind === 2) {
      const controller = new AbortController();
      setTimeout(() => controller.abort(), 100);
      await s.exec(['sleep', '300'], { env, signal: controller.signal }).catch(() => undefined);
    } else {
      await s.exec(['sh', '-c', 'mkdir -p a/b && chmod 000 a/b a; mkfifo f; ln -s / root; (setsid nohup sleep 300 >/dev/null 2>&1 &)'], { env });
    }
  } finally {
    await s.stop();
  }
}

describe('nothing left behind', () => {
  it('runs 64 sandboxes at once on this machine, each running a command', async () => {
    const results = await Promise.all(
      Array.from({ length: 64 }, async (_, i) => {
        const s = await driver.start(testSpec({ maxProcesses: 16, memoryMb: 128 }));
        try {
          return (await s.exec(['sh', '-c', `echo $((${i} * 2))`])).stdout;
        } finally {
          await s.stop();
        }
      }),
    );
    expect(results).toEqual(Array.from({ length: 64 }, (_, i) => `${i * 2}\n`));
  }, 180_000);

  it('leaves zero processes, mounts, cgroups and directories after 200 sandboxes with hung commands, timeouts, cancellations and hostile contents', async () => {
    const token = randomUUID();
    const dirsBefore = legacyDirs().length;
    for (let batch = 0; batch < 200; batch += 20) {
      await Promise.all(Array.from({ length: 20 }, (_, j) => lifeOf(batch + j, token)));
    }
    await waitFor(() => findHostProcessesWithEnv(TAG, token).length === 0, 10_000, 'every tagged process to be gone');
    expect(processesInOurCgroups()).toEqual([]);
    // This process's own sandboxes only: other test files (other vitest workers) run sandboxes at the same time.
    expect(cgroupsMatching('/bwrap-').filter((dir) => dir.includes(`/rollout-sandboxes/${process.pid}-`))).toEqual([]);
    expect(mountsMatching('rollout-stage')).toEqual([]);
    expect(legacyDirs().length).toBe(dirsBefore);
  }, 300_000);

  it('reaps the cgroups of a crashed predecessor and kills what is left in them, but not those of a live server', async () => {
    const dead = `999999999-1`; // no such process
    const live = `${process.ppid}-${readStartTime(process.ppid)}`;
    const dirs = (owner: string): string[] => ['memory', 'pids'].map((c) => `/sys/fs/cgroup/${c}/rollout-sandboxes/${owner}/bwrap-crashed`);
    for (const d of [...dirs(dead), ...dirs(live)]) mkdirSync(d, { recursive: true });
    const orphan = spawn('sleep', ['300'], { stdio: 'ignore' });
    await new Promise((r) => orphan.once('spawn', r));
    for (const d of dirs(dead)) writeFileSync(`${d}/cgroup.procs`, String(orphan.pid));
    const exited = new Promise((r) => orphan.once('exit', (_code, signal) => r(signal)));
    try {
      const { removed } = await new BubblewrapDriver().reap();
      expect(removed).toBeGreaterThanOrEqual(1);
      expect(await exited).toBe('SIGKILL');
      expect(cgroupsMatching(dead)).toEqual([]);
      expect(cgroupsMatching(live).length).toBe(4);
    } finally {
      orphan.kill('SIGKILL');
      for (const d of dirs(live)) rmdirSync(d);
      for (const c of ['memory', 'pids']) rmdirSync(`/sys/fs/cgroup/${c}/rollout-sandboxes/${live}`);
    }
  });
});

function readStartTime(pid: number): string {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]!;
}
