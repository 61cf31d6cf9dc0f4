import { describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { shmSizeMb, tmpfsSizeMb } from '../../src/sandboxes/bwrap-command.js';
import type { SandboxLimits } from '../../src/sandboxes/types.js';
import { callTool, closeAfterAll, sandboxesStoppedAfterEach } from './helpers.js';

const driver = closeAfterAll(new BubblewrapDriver());
const startSandbox = sandboxesStoppedAfterEach<BubblewrapSandbox>();
const start = (overrides: Partial<SandboxLimits> = {}): Promise<BubblewrapSandbox> => startSandbox(driver, overrides);
const MiB = 1024 * 1024;

// Review s35: /dev (bwrap's --dev tmpfs, owned by the sandbox's user) and /dev/shm in it were writable tmpfs of half
// the host's RAM: files there escaped diskMb and the cap that keeps tmpfs pages below the memory limit, so a model
// could fill its sandbox's memory cgroup with pages no OOM kill frees, and every later call failed.
describe('a sandbox\'s /dev and /dev/shm cannot hold more than its tmpfs budget', () => {
  it('/dev is read-only; /dev/shm is writable but sized, and its files leave room for the next call', async () => {
    const sandbox = await start({ memoryMb: 128, diskMb: 100 });
    const dev = await sandbox.exec(['/bin/sh', '-c', 'echo x > /dev/planted']);
    expect(dev.exitCode).not.toBe(0);
    const shm = await sandbox.exec(['/bin/sh', '-c', 'df -m /dev/shm | tail -1; echo x > /dev/shm/ok && cat /dev/shm/ok']);
    expect(shm.stdout).toContain('x');
    const sizeMb = Number(shm.stdout.trim().split(/\s+/)[1]);
    expect(sizeMb).toBeGreaterThan(0);
    expect(sizeMb).toBeLessThanOrEqual(shmSizeMb({ memoryMb: 128, diskMb: 100 }));
    expect(2 * tmpfsSizeMb({ memoryMb: 128, diskMb: 100 }) + sizeMb).toBeLessThan(128 - 32);
    const [fill] = await callTool('bash', { command: 'head -c 120M /dev/zero > /dev/shm/a; head -c 120M /dev/zero > /dev/b; echo done' }, sandbox);
    expect(fill!.output).toContain('done');
    expect(await callTool('python', { code: 'print(1)' }, sandbox)).toMatchObject([{ outcome: 'ok', output: '1' }]);
    expect(await sandbox.peakMemoryBytes()).toBeLessThanOrEqual(128 * MiB);
  }, 60_000);

  it('keeps what programs need of /dev: the null device, a pty, and POSIX semaphores in /dev/shm', async () => {
    const sandbox = await start();
    const code = 'import multiprocessing, os\nlock = multiprocessing.Lock()\nwith lock: pass\nm, s = os.openpty()\nopen("/dev/null", "w").write("x")\nprint("fine")';
    expect(await callTool('python', { code }, sandbox)).toMatchObject([{ outcome: 'ok', output: 'fine' }]);
  }, 60_000);
});
