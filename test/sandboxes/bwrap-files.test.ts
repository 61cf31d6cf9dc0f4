import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
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
  });

  it('rejects paths outside the work dir', async () => {
    await expect(sandbox.readFile('../etc/passwd')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.readFile('/etc/passwd')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.writeFile('/work/../x', '')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.readFile('/work')).rejects.toMatchObject({ code: 'invalid_argument' });
  });

  it('does not follow symlinks the program planted to host paths', async () => {
    const target = join(outside, 'host.txt');
    await sandbox.exec(['sh', '-c', `ln -s ${target} link.txt && ln -s ${outside} linkdir`]);
    await expect(sandbox.readFile('link.txt')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.writeFile('link.txt', 'overwritten')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.writeFile('linkdir/new.txt', 'x')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.readFile('linkdir/host.txt')).rejects.toMatchObject({ code: 'invalid_argument' });
    expect(await readFile(target, 'utf8')).toBe('host secret');
    expect(existsSync(join(outside, 'new.txt'))).toBe(false);
  });

  it('refuses a FIFO instead of blocking on it, and reports a missing file as not_found', async () => {
    await sandbox.exec(['mkfifo', 'pipe']);
    await expect(sandbox.readFile('pipe')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.writeFile('pipe', 'x')).rejects.toMatchObject({ code: 'invalid_argument' });
    await expect(sandbox.readFile('nope.txt')).rejects.toMatchObject({ code: 'not_found' });
  });
});
