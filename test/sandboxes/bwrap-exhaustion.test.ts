import { spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { statfs } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import type { SandboxLimits } from '../../src/sandboxes/types.js';
import { cgroupsMatching, closeAfterAll, findHostProcessesWithEnv, isAlive, testSpec, waitFor } from './helpers.js';

const driver = closeAfterAll(new BubblewrapDriver());
const started: BubblewrapSandbox[] = [];
const MiB = 1024 * 1024;

async function start(overrides: Partial<SandboxLimits> = {}): Promise<BubblewrapSandbox> {
  const sandbox = await driver.start(testSpec(overrides));
  started.push(sandbox);
  return sandbox;
}

afterEach(async () => {
  await Promise.all(started.splice(0).map((s) => s.stop()));
});

async function hostFreeBytes(): Promise<number> {
  const s = await statfs(tmpdir());
  return s.bavail * s.bsize;
}

describe('whole-sandbox limits (cgroups, tmpfs quotas)', () => {
  it('uses cgroup v1 on this machine (root, v1 memory and pids controllers)', () => {
    expect(driver.capabilities).toMatchObject({ cgroups: 'v1', identity: 'setuid' });
  });

  it('holds the memory limit across 5 processes of 300 MiB each under 512 MiB: some are OOM-killed', async () => {
    const sandbox = await start({ memoryMb: 512, commandTimeoutMs: 60_000 });
    const script = 'for i in 1 2 3 4 5; do python3 -c "b = bytearray(300 * 1024 * 1024); import time; time.sleep(3); print(1)" & done; wait';
    const r = await sandbox.exec(['sh', '-c', script]);
    const survivors = r.stdout.split('\n').filter(Boolean).length;
    expect(survivors).toBeLessThan(2);
    const peak = await sandbox.peakMemoryBytes();
    expect(peak).toBeDefined();
    expect(peak!).toBeLessThanOrEqual(512 * MiB);
  });

  it('counts /tmp against the memory limit: 400 MiB in /tmp under a 256 MiB sandbox fails', async () => {
    const sandbox = await start({ memoryMb: 256, diskMb: 1024 });
    const r = await sandbox.exec(['sh', '-c', 'dd if=/dev/zero of=/tmp/fill bs=1M count=400 2>&1; echo "exit $?"']);
    expect(r.exitCode === null || !r.stdout.includes('exit 0')).toBe(true);
    expect(await sandbox.peakMemoryBytes()).toBeLessThanOrEqual(256 * MiB);
  });

  it('holds the workspace quota across many files: 16 × 64 MiB into 256 MiB fails with ENOSPC, host disk untouched', async () => {
    const sandbox = await start({ memoryMb: 1024, diskMb: 256, maxFileMb: 128, commandTimeoutMs: 60_000 });
    const before = await hostFreeBytes();
    const code = `
import errno
written = 0
try:
    for i in range(16):
        with open(f"/work/f{i}", "wb") as f:
            for _ in range(64):
                f.write(b"x" * (1024 * 1024))
                written += 1
    print("wrote all")
except OSError as e:
    print("stopped", errno.errorcode[e.errno], written)
`;
    const r = await sandbox.exec(['python3', '-c', code]);
    const [word, code_, mib] = r.stdout.trim().split(' ');
    expect(word).toBe('stopped');
    expect(code_).toBe('ENOSPC');
    expect(Number(mib)).toBeLessThanOrEqual(256);
    // The workspace is a tmpfs: the host disk did not grow by anything like 256 MiB.
    expect(before - (await hostFreeBytes())).toBeLessThan(64 * MiB);
  });

  it('caps an unbounded fork bomb at the process limit, leaves the host able to fork, and still stops', async () => {
    const sandbox = await start({ maxProcesses: 32 });
    const token = randomUUID();
    // The bomb backgrounds itself: the exec returns while it keeps forking inside the sandbox.
    await sandbox.exec(['sh', '-c', 'b() { b | b & }; b'], { timeoutMs: 5_000, env: { SBX_TEST_TOKEN: token } });
    await sleep(1_000);
    const inSandbox = cgroupsMatching(sandbox.id).filter((d) => d.includes('/pids/'))[0]!;
    expect(Number(readFileSync(join(inSandbox, 'pids.current'), 'utf8'))).toBeLessThanOrEqual(32 + 3);
    expect(Number(readFileSync(join(inSandbox, 'pids.max'), 'utf8'))).toBe(32 + 3);
    expect(spawnSync('true').status).toBe(0); // the host still forks
    await sandbox.stop();
    await waitFor(() => findHostProcessesWithEnv('SBX_TEST_TOKEN', token).length === 0, 10_000, 'the fork bomb to be gone');
  });

  it('caps endless output and can still stop the command by timeout and by abort', async () => {
    const sandbox = await start({ outputLimitBytes: 1024 });
    const r = await sandbox.exec(['yes'], { timeoutMs: 1_000 });
    expect(r).toMatchObject({ timedOut: true, truncated: true });
    expect(r.stdout.length).toBe(1024);
    const controller = new AbortController();
    const pending = sandbox.exec(['yes'], { signal: controller.signal });
    setTimeout(() => controller.abort(), 300);
    await expect(pending).rejects.toMatchObject({ code: 'cancelled' });
  });

  it('kills processes that try to outlive their sandbox (setsid, double fork, nohup)', async () => {
    const sandbox = await start();
    const token = randomUUID();
    const code = `
import os, subprocess
subprocess.Popen(["nohup", "sleep", "300"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.fork() == 0:
    fd = os.open("/dev/null", os.O_RDWR)
    for n in (0, 1, 2): os.dup2(fd, n)
    os.setsid()
    if os.fork() == 0:
        import time; time.sleep(300)
    os._exit(0)
open("/work/ready", "w").write("1")
`;
    const r = await sandbox.exec(['python3', '-c', code], { env: { SBX_TEST_TOKEN: token } });
    expect(r.exitCode).toBe(0);
    await waitFor(() => findHostProcessesWithEnv('SBX_TEST_TOKEN', token).length >= 2, 10_000, 'the escapees to run');
    const procs = findHostProcessesWithEnv('SBX_TEST_TOKEN', token);
    // They survive the command that started them (the sandbox is long-lived) ...
    expect(procs.every(isAlive)).toBe(true);
    await sandbox.stop();
    // ... but not the sandbox.
    expect(procs.some(isAlive)).toBe(false);
  });
});
