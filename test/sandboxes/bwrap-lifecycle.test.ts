import { randomUUID } from 'node:crypto';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import { cgroupsMatching, closeAfterAll, findHostProcessesWithEnv, isAlive, testSpec, waitForFileInSandbox } from './helpers.js';

const driver = closeAfterAll(new BubblewrapDriver());

describe('bubblewrap sandbox lifecycle', () => {
  let fakes: string;

  beforeAll(async () => {
    fakes = await mkdtemp(join(tmpdir(), 'fake-bwrap-'));
    await chmod(fakes, 0o755); // as root, bwrap runs as the sandbox's own uid, which must reach it
  });

  afterAll(async () => {
    await rm(fakes, { recursive: true, force: true });
  });

  it('stop() kills a running exec with its background sleep and removes its cgroups; it is idempotent', async () => {
    const sandbox = await driver.start(testSpec());
    const token = randomUUID();
    const pending = sandbox.exec(['sh', '-c', 'sleep 300 & touch /work/ready; wait'], { env: { SBX_TEST_TOKEN: token } });
    const outcome = pending.then(() => 'resolved', (err: unknown) => err);
    await waitForFileInSandbox(sandbox, '/work/ready');
    const procs = findHostProcessesWithEnv('SBX_TEST_TOKEN', token);
    expect(procs.length).toBeGreaterThanOrEqual(2);
    expect(cgroupsMatching(sandbox.id).length).toBeGreaterThan(0);

    await Promise.all([sandbox.stop(), sandbox.stop()]);
    expect(await outcome).toMatchObject({ code: 'sandbox_error' });
    expect(procs.some(isAlive)).toBe(false);
    expect(cgroupsMatching(sandbox.id)).toEqual([]);
    await sandbox.stop();
  });

  it('fails exec, writeFile and readFile after stop with sandbox_error', async () => {
    const sandbox = await driver.start(testSpec());
    await sandbox.stop();
    await expect(sandbox.exec(['true'])).rejects.toMatchObject({ code: 'sandbox_error' });
    await expect(sandbox.writeFile('a.txt', 'x')).rejects.toMatchObject({ code: 'sandbox_error' });
    await expect(sandbox.readFile('a.txt')).rejects.toMatchObject({ code: 'sandbox_error' });
  });

  it('leaves nothing on the host disk: the workspace is a tmpfs inside the sandbox, whatever the program did to it', async () => {
    const sandbox = await driver.start(testSpec());
    const deep = Array.from({ length: 40 }, (_, i) => `${String(i).padStart(2, '0')}${'d'.repeat(240)}`);
    const r = await sandbox.exec(['python3', '-c', `import os
for d in ${JSON.stringify(deep)}:
    os.mkdir(d); os.chdir(d)
open('f', 'w').write('x')
os.chdir('/work'); os.makedirs('locked/inner'); os.chmod('locked/inner', 0); os.chmod('locked', 0)
print('ok')`]);
    expect(r.stdout).toBe('ok\n');
    await sandbox.stop();
    expect(cgroupsMatching(sandbox.id)).toEqual([]);
  });

  it('reports a bwrap that cannot start as sandbox_error with its stderr', async () => {
    const fake = join(fakes, 'bwrap');
    await writeFile(fake, '#!/bin/sh\necho "bwrap: setting up uid map: Permission denied" >&2\nexit 1\n');
    await chmod(fake, 0o755);
    const broken = new BubblewrapDriver({ bwrapPath: fake });
    await expect(broken.start(testSpec())).rejects.toMatchObject({
      code: 'sandbox_error',
      message: expect.stringContaining('setting up uid map: Permission denied'),
    });
    const missing = new BubblewrapDriver({ bwrapPath: join(fakes, 'no-such-bwrap') });
    await expect(missing.start(testSpec())).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringMatching(/ENOENT|No such file/) });
  });

  it('tells a program that exits 1 from a sandbox that failed to start, and reports deaths by signal', async () => {
    const sandbox = await driver.start(testSpec());
    try {
      const r = await sandbox.exec(['sh', '-c', 'echo "bwrap: pretending to fail" >&2; exit 1']);
      expect(r).toMatchObject({ exitCode: 1, stderr: 'bwrap: pretending to fail\n' });
      const missing = await sandbox.exec(['no-such-program']);
      expect(missing.exitCode).toBe(127);
      const killed = await sandbox.exec(['python3', '-c', 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)']);
      expect(killed).toMatchObject({ exitCode: null, signal: 'SIGSEGV', timedOut: false });
    } finally {
      await sandbox.stop();
    }
  });

  it('rejects invalid limits and a start signal that already fired', async () => {
    await expect(driver.start(testSpec({ memoryMb: 0 }))).rejects.toMatchObject({ code: 'invalid_argument', field: 'limits.memoryMb' });
    const controller = new AbortController();
    controller.abort();
    await expect(driver.start(testSpec(), controller.signal)).rejects.toMatchObject({ code: 'cancelled' });
  });
});
