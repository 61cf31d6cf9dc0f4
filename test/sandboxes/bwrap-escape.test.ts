import { cp, mkdir, mkdtemp, rm, symlink } from 'node:fs/promises';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { SANDBOX_INIT_PATH } from '../../src/sandboxes/init/sandbox-init.js';
import { closeAfterAll, testSpec } from './helpers.js';

const driver = closeAfterAll(new BubblewrapDriver());

/** A tiny directory image: dash, the coreutils and find the file operations need (and a few more), with their libraries; no /work, /tmp or /proc. */
async function makeTinyImage(root: string): Promise<void> {
  const binaries = ['/bin/dash', '/usr/bin/cat', '/usr/bin/head', '/usr/bin/wc', '/usr/bin/mkdir', '/usr/bin/touch', '/usr/bin/id', '/usr/bin/find', '/usr/bin/ls', '/usr/bin/unshare'];
  const libs = new Set<string>();
  for (const bin of binaries) {
    for (const m of execFileSync('ldd', [bin], { encoding: 'utf8' }).matchAll(/(\/\S+) \(0x/g)) libs.add(m[1]!);
  }
  for (const file of [...binaries, ...libs]) {
    const dest = join(root, file.replace(/^\/bin\//, '/usr/bin/'));
    await mkdir(dirname(dest), { recursive: true });
    await cp(file, dest, { dereference: true });
  }
  await symlink('dash', join(root, 'usr/bin/sh'));
  await symlink('usr/bin', join(root, 'bin'));
  await mkdir(join(root, 'etc'));
  for (const dir of ['lib', 'lib64']) {
    await rm(join(root, dir), { recursive: true, force: true });
    await mkdir(join(root, 'usr', dir), { recursive: true });
    await symlink(`usr/${dir}`, join(root, dir));
  }
  for (const lib of libs) {
    const dest = join(root, 'usr', lib);
    await mkdir(dirname(dest), { recursive: true });
    await cp(lib, dest, { dereference: true });
  }
}

describe('bubblewrap sandbox escape attempts', () => {
  let sandbox: BubblewrapSandbox;
  let image: string;

  beforeAll(async () => {
    process.env.ROLLOUT_ESCAPE_TEST_SECRET = 'server-secret-7d1f';
    sandbox = await driver.start(testSpec());
    image = await mkdtemp(join(tmpdir(), 'tiny-image-'));
    await makeTinyImage(image);
    execFileSync('chmod', ['-R', 'a+rX', image]);
  });

  afterAll(async () => {
    delete process.env.ROLLOUT_ESCAPE_TEST_SECRET;
    await sandbox?.stop();
    if (image) await rm(image, { recursive: true, force: true });
  });

  it("cannot read the host's /root, /etc/shadow, /proc/1/environ of the host or the server's environment", async () => {
    const r = await sandbox.exec(['sh', '-c', [
      'ls /root/.ssh /root/.bashrc 2>/dev/null && echo root-visible',
      'cat /etc/shadow 2>/dev/null && echo shadow-visible',
      'cat /proc/*/environ 2>/dev/null | tr "\\0" "\\n" | grep -c server-secret',
      'echo "$ROLLOUT_ESCAPE_TEST_SECRET" | grep -c server-secret',
    ].join('; ')]);
    expect(r.stdout).toBe('0\n0\n');
    // pid 1 inside is the sandbox init, never the host's init.
    expect((await sandbox.exec(['cat', '/proc/1/cmdline'])).stdout.split('\0')[0]).toBe(SANDBOX_INIT_PATH);
  });

  it('cannot create user namespaces (unshare -r fails), nor gain privileges', async () => {
    const r = await sandbox.exec(['sh', '-c', 'unshare -r id 2>&1; echo "unshare $?"; unshare -U true 2>&1; echo "unshare-U $?"; grep -E "^(NoNewPrivs|CapEff)" /proc/self/status']);
    expect(r.stdout).toMatch(/unshare [1-9]/);
    expect(r.stdout).toMatch(/unshare-U [1-9]/);
    expect(r.stdout).toContain('NoNewPrivs:\t1');
    expect(r.stdout).toContain('CapEff:\t0000000000000000');
  });

  it('cannot see or signal host processes', async () => {
    const r = await sandbox.exec(['sh', '-c', `kill -0 ${process.pid} 2>/dev/null && echo can-signal; ls /proc | grep -c '^[0-9]'`]);
    expect(r.stdout.trim()).toMatch(/^\d$/); // a handful of its own processes, no "can-signal"
  });

  it('runs a directory image with a read-only root and a writable workspace, and cannot write the image', async () => {
    const listing = (): string => execFileSync('find', [image, '-printf', '%p %s %T@\\n'], { encoding: 'utf8' });
    const before = listing();
    const s = await driver.start({ ...testSpec(), image });
    try {
      const r = await s.exec(['sh', '-c', 'id -u; echo hi > /work/a && cat /work/a; for p in /x /usr/x /etc/x /bin/x; do touch $p 2>/dev/null && echo $p-writable; done; touch /tmp/t && echo tmp-ok; unshare -r true 2>/dev/null || echo no-userns']);
      expect(r.stdout).toBe('1000\nhi\ntmp-ok\nno-userns\n');
      await s.writeFile('sub/f.txt', 'image ok');
      expect(await s.readFile('/work/sub/f.txt')).toBe('image ok');
      expect(await s.listDir('/work')).toEqual([{ name: 'a', type: 'file', size: 3 }, { name: 'sub', type: 'dir', size: 0 }]);
      await expect(s.writeFile('/usr/evil', 'x')).rejects.toMatchObject({ code: 'invalid_argument' });
    } finally {
      await s.stop();
    }
    expect(listing()).toBe(before);
  });

  it('binds spec mounts read-only unless asked, and sets spec env', async () => {
    const shared = await mkdtemp(join(tmpdir(), 'shared-'));
    execFileSync('chmod', ['0755', shared]);
    execFileSync('sh', ['-c', `echo data > ${shared}/in.txt && chmod 644 ${shared}/in.txt`]);
    const s = await driver.start({ ...testSpec(), mounts: [{ source: shared, target: '/data' }], env: { TASK_ID: 't-1' } });
    try {
      const r = await s.exec(['sh', '-c', 'cat /data/in.txt; echo "$TASK_ID"; touch /data/new 2>/dev/null && echo writable']);
      expect(r.stdout).toBe('data\nt-1\n');
    } finally {
      await s.stop();
      await rm(shared, { recursive: true, force: true });
    }
  });
});
