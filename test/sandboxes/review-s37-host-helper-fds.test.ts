import { execFileSync, spawn } from 'node:child_process';
import { closeSync, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { makeSquashfs } from './images/tiny-image.js';

const cli = fileURLToPath(new URL('./review-s37-fuse-fd-cli.ts', import.meta.url));
const hasSquashfuse = ['squashfuse', 'mksquashfs', 'fusermount3'].every((tool) => {
  try {
    execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
});

// Review s37: host-side helpers the server starts outside any sandbox got every descriptor the server inherited
// without close-on-exec. squashfuse daemonizes and serves an image for as long as it is used (after the server is gone
// too): a supervisor's or harness's pipe it inherited stayed open in it, so the pipe's reader never saw EOF.
describe.skipIf(!hasSquashfuse)('the squashfuse daemon of an image mount', () => {
  const dir = mkdtempSync(join(tmpdir(), 'review-s37-fuse-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('holds none of the server\'s inherited descriptors', async () => {
    mkdirSync(join(dir, 'root'));
    writeFileSync(join(dir, 'root/hello.txt'), 'hello\n');
    makeSquashfs(join(dir, 'root'), join(dir, 'image.sqfs'));
    mkdirSync(join(dir, 'mnt'));
    const marker = join(dir, 'inherited-host-file');
    writeFileSync(marker, 'host secret\n');
    const fd = openSync(marker, 'r');
    let out = '';
    try {
      const stdio: Array<'ignore' | 'pipe' | 'inherit' | number> = Array(252).fill('ignore');
      stdio[1] = 'pipe';
      stdio[2] = 'inherit';
      stdio[20] = fd;
      stdio[251] = 'pipe';
      const child = spawn(process.execPath, ['--import', 'tsx', cli, join(dir, 'image.sqfs'), join(dir, 'mnt')], { stdio });
      child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
      expect(await new Promise((resolve) => child.once('close', resolve))).toBe(0);
    } finally {
      closeSync(fd);
    }
    const fds = out.split('\n').filter(Boolean);
    expect(fds.length).toBeGreaterThan(0);
    expect(fds.filter((line) => line.includes('inherited-host-file') || /^(20|251) /.test(line))).toEqual([]);
  }, 60_000);
});
