import { randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { abortReason } from '../../src/errors.js';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import type { SandboxLimits } from '../../src/sandboxes/types.js';
import { closeAfterAll, findHostProcessesWithEnv, isAlive, testSpec, waitFor, waitForFileInSandbox } from './helpers.js';

const driver = closeAfterAll(new BubblewrapDriver());
const started: BubblewrapSandbox[] = [];

async function start(overrides: Partial<SandboxLimits> = {}): Promise<BubblewrapSandbox> {
  const sandbox = await driver.start(testSpec(overrides));
  started.push(sandbox);
  return sandbox;
}

afterEach(async () => {
  await Promise.all(started.splice(0).map((s) => s.stop()));
});

/** Spawns a session-leading `sleep` and a double-forked grandchild, writes /work/ready, then spins forever. */
const ESCAPING_SPINNER = `
import os, subprocess, time
subprocess.Popen(["sleep", "300"], start_new_session=True)
child = os.fork()
if child == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(300)
    os._exit(0)
# The intermediate child exits only once it has forked the grandchild: after this, all three processes exist.
os.waitpid(child, 0)
open("/work/ready", "w").write("1")
while True:
    pass
`;

describe('bubblewrap sandbox limits', () => {
  it('kills a busy loop and its escaped descendants on timeout', async () => {
    const sandbox = await start();
    const token = randomUUID();
    const pending = sandbox.exec(['python3', '-c', ESCAPING_SPINNER], { timeoutMs: 2_000, env: { SBX_TEST_TOKEN: token } });
    await waitForFileInSandbox(sandbox, '/work/ready');
    const procs = findHostProcessesWithEnv('SBX_TEST_TOKEN', token);
    expect(procs.length).toBeGreaterThanOrEqual(3); // python, sleep, the double-forked grandchild
    const r = await pending;
    expect(r).toMatchObject({ timedOut: true, exitCode: null });
    expect(r.durationMs).toBeLessThan(6_000);
    await waitFor(() => procs.every((p) => !isAlive(p)), 3_000, 'every process of the exec to be gone');
  });

  it('kills a process whose allocation passes the sandbox memory limit, while a small one works', async () => {
    const sandbox = await start({ memoryMb: 256 });
    const code = 'small = bytearray(32 * 1024 * 1024)\nprint("small ok", flush=True)\nbig = bytearray(512 * 1024 * 1024)\nprint("big ok")';
    const r = await sandbox.exec(['python3', '-c', code]);
    expect(r.stdout).toBe('small ok\n');
    expect(r.signal).toBe('SIGKILL'); // the cgroup's OOM killer
    expect(await sandbox.peakMemoryBytes()).toBeLessThanOrEqual(256 * 1024 * 1024);
  });

  it('stops a file from growing past maxFileMb, so one sandbox cannot fill the host disk with it', async () => {
    const sandbox = await start({ maxFileMb: 8 });
    const code = [
      'chunk = b"x" * (1024 * 1024)',
      'try:',
      '    with open("/work/big", "wb") as f:',
      '        for _ in range(64):',
      '            f.write(chunk)',
      '            f.flush()',
      '    print("wrote 64 MiB")',
      'except OSError as e:',
      '    print("refused", e.errno)',
    ].join('\n');
    const r = await sandbox.exec(['python3', '-c', code]);
    expect(r.stdout.trim()).toBe('refused 27'); // EFBIG
    const size = Number((await sandbox.exec(['wc', '-c', '/work/big'])).stdout.split(' ')[0]);
    expect(size).toBeLessThanOrEqual(8 * 1024 * 1024);
  });

  it('stops a bounded fork bomb at the process limit', async () => {
    const sandbox = await start({ maxProcesses: 12 });
    const code = `
import os, time
forked, error = 0, None
for _ in range(40):
    try:
        pid = os.fork()
    except OSError as e:
        error = e.errno
        break
    if pid == 0:
        time.sleep(0.5)
        os._exit(0)
    forked += 1
print(forked, error)
`;
    const r = await sandbox.exec(['python3', '-c', code]);
    const [forked, errno] = r.stdout.trim().split(' ');
    expect(Number(forked)).toBeGreaterThan(0);
    expect(Number(forked)).toBeLessThan(12);
    expect(errno).toBe('11'); // EAGAIN
  });

  it('keeps only outputLimitBytes of a 10 MB print and says it truncated', async () => {
    const sandbox = await start({ outputLimitBytes: 64 * 1024 });
    const code = 'import sys\nsys.stdout.write("x" * 10_000_000)\nsys.stderr.write("e" * 100)';
    const r = await sandbox.exec(['python3', '-c', code]);
    expect(r.exitCode).toBe(0);
    expect(r.truncated).toBe(true);
    expect(r.stdout.length).toBe(64 * 1024);
    expect(r.stderr).toBe('e'.repeat(100));
  });

  it('bounds a call by the remaining wall-clock budget, then refuses further calls', async () => {
    const sandbox = await start({ wallClockMs: 1_500 });
    const r = await sandbox.exec(['sleep', '30'], { timeoutMs: 60_000 });
    expect(r.timedOut).toBe(true);
    expect(r.durationMs).toBeLessThan(4_000);
    await expect(sandbox.exec(['true'])).rejects.toMatchObject({ code: 'deadline_exceeded' });
  });

  it('aborts a running call through its AbortSignal and kills its processes', async () => {
    const sandbox = await start();
    const token = randomUUID();
    const controller = new AbortController();
    const begun = Date.now();
    const pending = sandbox.exec(['sh', '-c', 'sleep 300 & touch /work/ready; wait'], { signal: controller.signal, env: { SBX_TEST_TOKEN: token } });
    await waitForFileInSandbox(sandbox, '/work/ready');
    const procs = findHostProcessesWithEnv('SBX_TEST_TOKEN', token);
    expect(procs.length).toBeGreaterThanOrEqual(2);
    const outcome = pending.then(() => 'resolved', (err: unknown) => err);
    controller.abort(abortReason('deadline_exceeded', 'stage deadline'));
    expect(await outcome).toMatchObject({ code: 'deadline_exceeded' });
    expect(Date.now() - begun).toBeLessThan(10_000);
    await waitFor(() => procs.every((p) => !isAlive(p)), 3_000, 'the aborted processes to be gone');

    const cancelled = new AbortController();
    cancelled.abort();
    await expect(sandbox.exec(['true'], { signal: cancelled.signal })).rejects.toMatchObject({ code: 'cancelled' });
  });
});
