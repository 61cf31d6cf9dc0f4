import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { testSpec } from './helpers.js';

describe('bubblewrap sandbox files', () => {
  let sandbox: BubblewrapSandbox;
  let outside: string;

  beforeAll(async () => {
    sandbox = await new BubblewrapDriver().start(testSpec());
    outside = await mkdtemp(join(tmpdir(), 'bwrap-outside-'));
    await writeFile(join(outside, 'host.txt'), 'host secret');
  });

  afterAll(async () => {
    await sandbox?.stop();
    await rm(outside, { recursive: true, force: true });
  });

  it('writes files the sandbox can read and modify, and reads what it wrote', async () => {
    await sandbox.writeFile('pkg/mod.py', 'VALUE = 41\n');
    const r = await sandbox.exec(['python3', '-c', 'import sys; sys.path.insert(0, "pkg"); import mod; open("/work/pkg/mod.py", "a").write("VALUE += 1\\n"); open("out.txt", "w").write("é ok")']);
    expect(r.exitCode).toBe(0);
    expect(await sandbox.readFile('/work/out.txt')).toBe('é ok');
    expect(await sandbox.readFile('pkg/mod.py')).toBe('VALUE = 41\nVALUE += 1\n');
    await sandbox.writeFile('/work/pkg/mod.py', 'short');
    expect(await sandbox.readFile('pkg/mod.py')).toBe('short');
    expect((await sandbox.exec(['stat', '-c', '%u', 'pkg/mod.py'])).stdout).toBe('1000\n');
  });

  it('lists a directory with types and sizes', async () => {
    await sandbox.writeFile('list/a.txt', 'abc');
    await sandbox.exec(['sh', '-c', 'mkdir list/sub && ln -s a.txt list/link && mkfifo list/fifo']);
    expect(await sandbox.listDir('list')).toEqual([
      { name: 'a.txt', type: 'file', size: 3 },
      { name: 'fifo', type: 'other', size: 0 },
      { name: 'link', type: 'symlink', size: 0 },
      { name: 'sub', type: 'dir', size: 0 },
    ]);
    await expect(sandbox.listDir('list/a.txt')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.listDir('nope')).rejects.toMatchObject({ code: 'not_found' });
  });

  it('resolves paths in the sandbox, not on the host, and cannot write outside the writable areas', async () => {
    expect(await sandbox.readFile('/etc/hostname').catch((e: { code: string }) => e.code)).toBe('not_found'); // not the host's
    await expect(sandbox.readFile(join(outside, 'host.txt'))).rejects.toMatchObject({ code: 'not_found' });
    await expect(sandbox.writeFile('/usr/evil.txt', 'x')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.writeFile('/etc/evil.txt', 'x')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.writeFile('/evil.txt', 'x')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.readFile('/work')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.readFile('a\0b')).rejects.toMatchObject({ code: 'invalid_argument' });
    await sandbox.writeFile('/tmp/scratch.txt', 'tmp ok');
    expect(await sandbox.readFile('/tmp/scratch.txt')).toBe('tmp ok');
  });

  it('does not follow symlinks the program planted to host paths onto the host', async () => {
    const target = join(outside, 'host.txt');
    await sandbox.exec(['sh', '-c', `ln -s ${target} link.txt && ln -s ${outside} linkdir && ln -s /etc/shadow shadow`]);
    await expect(sandbox.readFile('link.txt')).rejects.toMatchObject({ code: 'not_found' });
    await expect(sandbox.readFile('shadow')).rejects.toMatchObject({ code: 'not_found' });
    await expect(sandbox.writeFile('link.txt', 'overwritten')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.writeFile('linkdir/new.txt', 'x')).rejects.toMatchObject({ code: 'invalid_argument' });
    expect(await readFile(target, 'utf8')).toBe('host secret');
    expect(existsSync(join(outside, 'new.txt'))).toBe(false);
  });

  it('refuses a FIFO instead of blocking on it, a file over maxBytes, and reports a missing file as not_found', async () => {
    await sandbox.exec(['mkfifo', 'pipe']);
    await expect(sandbox.readFile('pipe')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.writeFile('pipe', 'x')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.readFile('nope.txt')).rejects.toMatchObject({ code: 'not_found' });
    await sandbox.writeFile('big.txt', 'x'.repeat(1000));
    await expect(sandbox.readFile('big.txt', { maxBytes: 999 })).rejects.toMatchObject({ code: 'invalid_argument' });
    expect((await sandbox.readFile('big.txt', { maxBytes: 1000 })).length).toBe(1000);
  });

  it('cancels a file operation through its signal', async () => {
    const controller = new AbortController();
    controller.abort();
    await expect(sandbox.readFile('out.txt', { signal: controller.signal })).rejects.toMatchObject({ code: 'cancelled' });
  });
});
