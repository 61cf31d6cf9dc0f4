import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import { findHostProcessesWithEnv, isAlive, testSpec, waitFor } from './helpers.js';

const driver = new BubblewrapDriver();

describe('bubblewrap sandbox lifecycle', () => {
  let fakes: string;

  beforeAll(async () => {
    fakes = await mkdtemp(join(tmpdir(), 'fake-bwrap-'));
  });

  afterAll(async () => {
    await rm(fakes, { recursive: true, force: true });
  });

  it('stop() kills a running exec with its background sleep and removes the work dir; it is idempotent', async () => {
    const sandbox = await driver.start(testSpec());
    const token = randomUUID();
    const pending = sandbox.exec(['sh', '-c', 'sleep 300 & touch /work/ready; wait'], { env: { SBX_TEST_TOKEN: token } });
    const outcome = pending.then(() => 'resolved', (err: unknown) => err);
    await waitFor(() => existsSync(join(sandbox.hostWorkdir, 'ready')), 10_000, 'the sleeper to start');
    const procs = findHostProcessesWithEnv('SBX_TEST_TOKEN', token);
    expect(procs.length).toBeGreaterThanOrEqual(2);

    await Promise.all([sandbox.stop(), sandbox.stop()]);
    expect(await outcome).toMatchObject({ code: 'sandbox_error' });
    expect(procs.some(isAlive)).toBe(false);
    expect(existsSync(sandbox.hostWorkdir)).toBe(false);
    await sandbox.stop();
  });

  it('fails exec, writeFile and readFile after stop with sandbox_error', async () => {
    const sandbox = await driver.start(testSpec());
    await sandbox.stop();
    await expect(sandbox.exec(['true'])).rejects.toMatchObject({ code: 'sandbox_error' });
    await expect(sandbox.writeFile('a.txt', 'x')).rejects.toMatchObject({ code: 'sandbox_error' });
    await expect(sandbox.readFile('a.txt')).rejects.toMatchObject({ code: 'sandbox_error' });
  });

  it('removes a work dir the program made hard to delete', async () => {
    const sandbox = await driver.start(testSpec());
    await sandbox.exec(['sh', '-c', 'mkdir -p locked/inner && echo x > locked/inner/f && chmod 000 locked/inner locked']);
    await sandbox.stop();
    expect(existsSync(sandbox.hostWorkdir)).toBe(false);
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
    await expect(missing.start(testSpec())).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringContaining('ENOENT') });
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
