import { execFile, spawn } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../../src/errors.js';
import { listMounts } from '../../../src/sandboxes/images/fuse-mounts.js';
import { SifImageMounts } from '../../../src/sandboxes/images/sif-mount.js';
import { readSifFile } from '../../../src/sandboxes/images/sif.js';
import { makeTinySif } from './tiny-image.js';

const run = promisify(execFile);
const isRoot = process.getuid?.() === 0;
const DROPPED_UID = String(0x60000000 + 77);
const holdMountCli = fileURLToPath(new URL('./hold-mount-cli.ts', import.meta.url));

let dir: string;
let tiny: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'sif-mount-test-'));
  chmodSync(dir, 0o755);
  tiny = makeTinySif(dir);
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let roots = 0;
/** A fresh mount root per test, so tests never see each other's mounts. */
function newMountRoot(): string {
  return join(dir, `mounts-${roots++}`);
}

async function mountsUnder(root: string): Promise<string[]> {
  return (await listMounts()).map((m) => m.mountPoint).filter((p) => p.startsWith(`${root}/`));
}

/** The image's /bin/sh under plain bwrap with the mounted image as /, as the driver will run it. */
function bwrapArgs(root: string, script: string): string[] {
  return ['--ro-bind', root, '/', '--proc', '/proc', '--dev', '/dev', '--unshare-pid', '--die-with-parent', '/bin/sh', '-c', script];
}

describe('SifImageMounts', () => {
  it('mounts a SIF read-only and serves its files', async () => {
    const mountRoot = newMountRoot();
    const images = new SifImageMounts({ mountRoot, graceMs: 0 });
    const image = await images.acquire(tiny);
    expect(image.root.startsWith(`${mountRoot}/`)).toBe(true);
    expect(readFileSync(join(image.root, 'hello.txt'), 'utf8')).toBe('hello from the image\n');
    expect(() => writeFileSync(join(image.root, 'new.txt'), 'x')).toThrow(/EROFS|read-only/i);
    const mount = (await listMounts()).find((m) => m.mountPoint === image.root);
    expect(mount?.fsType).toBe('fuse.squashfuse');
    await image.release();
    expect(await mountsUnder(mountRoot)).toEqual([]);
  });

  it('runs /bin/sh from the mounted image under bwrap', async () => {
    const images = new SifImageMounts({ mountRoot: newMountRoot(), graceMs: 0 });
    const image = await images.acquire(tiny);
    try {
      const { stdout } = await run('bwrap', bwrapArgs(image.root, 'echo ok; cat /hello.txt'));
      expect(stdout).toBe('ok\nhello from the image\n');
    } finally {
      await image.release();
    }
  });

  it.runIf(isRoot)('lets a dropped uid read the mount when the server runs as root (setpriv inside bwrap, as the driver does)', async () => {
    const images = new SifImageMounts({ mountRoot: newMountRoot(), graceMs: 0 });
    const image = await images.acquire(tiny);
    try {
      const script = `exec /bin/setpriv --reuid ${DROPPED_UID} --regid ${DROPPED_UID} --clear-groups /bin/sh -c 'echo ok; cat /hello.txt'`;
      const { stdout } = await run('bwrap', bwrapArgs(image.root, script));
      expect(stdout).toBe('ok\nhello from the image\n');
      // The same process under a dropped uid in a mount made without allow_other is refused: the option matters.
      const bare = join(dir, 'bare-mount');
      mkdirSync(bare, { recursive: true });
      await run('squashfuse', ['-o', `ro,offset=${(await readSifFile(tiny)).offset}`, tiny, bare]);
      try {
        await expect(run('bwrap', bwrapArgs(bare, script))).rejects.toThrow(/Permission denied/);
      } finally {
        await run('fusermount3', ['-u', bare]);
      }
    } finally {
      await image.release();
    }
  });

  it('mounts an image once for concurrent acquires and shares it until the last release', async () => {
    const mountRoot = newMountRoot();
    const images = new SifImageMounts({ mountRoot, graceMs: 0 });
    const [a, b] = await Promise.all([images.acquire(tiny), images.acquire(tiny)]);
    expect(a.root).toBe(b.root);
    expect(await mountsUnder(mountRoot)).toEqual([a.root]);
    await a.release();
    await a.release(); // idempotent: does not take b's hold
    expect(await mountsUnder(mountRoot)).toEqual([a.root]);
    expect(readFileSync(join(b.root, 'hello.txt'), 'utf8')).toContain('hello');
    await b.release();
    expect(await mountsUnder(mountRoot)).toEqual([]);
    expect(readdirSync(mountRoot)).toEqual([]);
  });

  it('keeps a released image mounted during the grace period, reuses it, and unmounts it on close', async () => {
    const mountRoot = newMountRoot();
    const images = new SifImageMounts({ mountRoot, graceMs: 60_000 });
    const first = await images.acquire(tiny);
    await first.release();
    expect(await mountsUnder(mountRoot)).toEqual([first.root]);
    const again = await images.acquire(tiny);
    expect(again.root).toBe(first.root);
    await again.release();
    await images.close();
    expect(await mountsUnder(mountRoot)).toEqual([]);
  });

  it('mounts a rebuilt image file afresh (the key includes inode and mtime)', async () => {
    const mountRoot = newMountRoot();
    const images = new SifImageMounts({ mountRoot, graceMs: 0 });
    const copy = join(dir, 'rebuilt.sif');
    copyFileSync(tiny, copy);
    const before = await images.acquire(copy);
    rmSync(copy);
    copyFileSync(tiny, copy);
    const after = await images.acquire(copy);
    expect(after.root).not.toBe(before.root);
    await Promise.all([before.release(), after.release()]);
    expect(await mountsUnder(mountRoot)).toEqual([]);
  });

  it('fails to acquire a corrupt SIF with sandbox_error naming the file and the reason, leaving nothing behind', async () => {
    const mountRoot = newMountRoot();
    const corrupt = join(dir, 'corrupt.sif');
    copyFileSync(tiny, corrupt);
    truncateSync(corrupt, 40_000);
    const images = new SifImageMounts({ mountRoot, graceMs: 0 });
    const err = await images.acquire(corrupt).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RolloutError);
    expect((err as RolloutError).code).toBe('sandbox_error');
    expect((err as RolloutError).message).toContain(corrupt);
    expect((err as RolloutError).message).toContain('truncated');
    expect(existsSync(mountRoot) ? readdirSync(mountRoot) : []).toEqual([]);
  });

  it('fails an acquire whose signal is aborted with cancelled and leaves no mount', async () => {
    const mountRoot = newMountRoot();
    const images = new SifImageMounts({ mountRoot, graceMs: 0 });
    const controller = new AbortController();
    const pending = images.acquire(tiny, controller.signal);
    controller.abort();
    const err = await pending.catch((e: unknown) => e);
    expect((err as RolloutError).code).toBe('cancelled');
    await images.close();
    expect(await mountsUnder(mountRoot)).toEqual([]);
  });

  it('leaves no mount after 20 concurrent acquires and releases', async () => {
    const mountRoot = newMountRoot();
    const images = new SifImageMounts({ mountRoot, graceMs: 0 });
    const roots = await Promise.all(
      Array.from({ length: 20 }, async (_, i) => {
        const image = await images.acquire(tiny);
        const root = image.root;
        if (i % 2 === 0) await image.release();
        else setImmediate(() => void image.release());
        return root;
      }),
    );
    expect(new Set(roots).size).toBeGreaterThanOrEqual(1);
    await images.close();
    expect(await mountsUnder(mountRoot)).toEqual([]);
    expect(readdirSync(mountRoot)).toEqual([]);
  });

  it('reaps a stale mount left by a killed process', async () => {
    const mountRoot = newMountRoot();
    const child = spawn(process.execPath, ['--import', 'tsx', holdMountCli, mountRoot, tiny], { stdio: ['ignore', 'pipe', 'inherit'] });
    const [line] = await new Promise<string[]>((resolve, reject) => {
      createInterface({ input: child.stdout }).once('line', (l) => resolve([l]));
      child.once('exit', (code) => reject(new Error(`holder exited with ${code}`)));
    });
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
    expect(await mountsUnder(mountRoot)).toEqual([line]);
    expect(readFileSync(join(line!, 'hello.txt'), 'utf8')).toContain('hello'); // squashfuse outlives its mounter

    const successor = new SifImageMounts({ mountRoot, graceMs: 0 });
    expect(await successor.reap()).toEqual({ removed: 1 });
    expect(await mountsUnder(mountRoot)).toEqual([]);
    expect(readdirSync(mountRoot)).toEqual([]);
  });

  it("reap leaves a live server's mounts and unmarked directories alone", async () => {
    const mountRoot = newMountRoot();
    const live = new SifImageMounts({ mountRoot, graceMs: 0 });
    const image = await live.acquire(tiny);
    mkdirSync(join(mountRoot, 'not-ours'));
    expect(await new SifImageMounts({ mountRoot }).reap()).toEqual({ removed: 0 });
    expect(await mountsUnder(mountRoot)).toEqual([image.root]);
    expect(existsSync(join(mountRoot, 'not-ours'))).toBe(true);
    await image.release();
  });

  it('refuses a mount root that other users may write', async () => {
    const mountRoot = newMountRoot();
    mkdirSync(mountRoot, { mode: 0o777 });
    chmodSync(mountRoot, 0o777);
    const err = await new SifImageMounts({ mountRoot }).acquire(tiny).catch((e: unknown) => e);
    expect((err as RolloutError).message).toMatch(/is not a directory private to uid/);
  });

  it('uses a directory image in place', async () => {
    const images = new SifImageMounts({ mountRoot: newMountRoot() });
    const image = await images.acquire(`${tiny}.rootfs`);
    expect(readFileSync(join(image.root, 'hello.txt'), 'utf8')).toContain('hello');
    await image.release();
  });
});
