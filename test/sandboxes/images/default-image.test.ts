import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultImagePath } from '../../../src/sandboxes/images/image-recipe.js';
import { SifImageMounts } from '../../../src/sandboxes/images/sif-mount.js';
import type { MountedImage } from '../../../src/sandboxes/images/image-mounts.js';

const run = promisify(execFile);
const isRoot = process.getuid?.() === 0;
const image = defaultImagePath();

// scripts/setup.sh builds the default image before the tests run; without it (setup not run) this is skipped.
describe.runIf(existsSync(image))('the default image (built by scripts/setup.sh)', () => {
  let dir: string;
  let images: SifImageMounts;
  let mounted: MountedImage;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'default-image-test-'));
    images = new SifImageMounts({ mountRoot: join(dir, 'mounts'), graceMs: 0 });
    mounted = await images.acquire(image);
  });
  afterAll(async () => {
    await mounted.release();
    rmSync(dir, { recursive: true, force: true });
  });

  const bwrap = (argv: string[]) => run('bwrap', ['--ro-bind', mounted.root, '/', '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/work', '--unshare-pid', '--die-with-parent', ...argv]);

  it('runs python3 and bash under bwrap', async () => {
    expect((await bwrap(['python3', '-c', 'print(1 + 1)'])).stdout).toBe('2\n');
    expect((await bwrap(['bash', '-c', 'cd /work && echo $((6 * 7)) > f && cat f'])).stdout).toBe('42\n');
  });

  it.runIf(isRoot)('runs python3 as a dropped uid (setpriv inside bwrap, as the driver does as root)', async () => {
    const uid = String(0x60000000 + 5);
    const { stdout } = await bwrap(['setpriv', '--reuid', uid, '--regid', uid, '--clear-groups', 'python3', '-c', 'import os; print(os.getuid())']);
    expect(stdout).toBe(`${uid}\n`);
  });

  it('is small and carries no apt lists, package caches or host files, but has what Apptainer runs', async () => {
    expect(statSync(image).size).toBeLessThan(60 * 1024 * 1024);
    const script = 'find /var/lib/apt/lists /var/cache/apt /usr/share/doc -mindepth 1 | wc -l; test -e /etc/hostname && echo hostname; test -x /.singularity.d/actions/exec && echo apptainer-ok';
    expect((await bwrap(['sh', '-c', script])).stdout).toBe('0\napptainer-ok\n');
  });
});
