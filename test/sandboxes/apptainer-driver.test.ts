import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ApptainerDriver } from '../../src/sandboxes/apptainer.js';
import { makeApptainerDouble, type ApptainerDouble } from './apptainer-double.js';
import { testSpec } from './helpers.js';

// The driver's own behaviour (command lines it really runs, error mapping, fallback, stop, reap) against the
// apptainer TEST DOUBLE; the Sandbox contract itself is in the conformance suite.
const doubles: ApptainerDouble[] = [];
function setup(options: { refuseCgroups?: boolean; refuseOverlay?: 'create' | 'start' } = {}): { double: ApptainerDouble; driver: (o?: ConstructorParameters<typeof ApptainerDriver>[0]) => ApptainerDriver } {
  const double = makeApptainerDouble(options);
  doubles.push(double);
  return { double, driver: (o = {}) => new ApptainerDriver({ binary: double.binary, tmpRoot: double.tmpRoot, ...o }) };
}
afterAll(async () => {
  await Promise.all(doubles.map((d) => d.cleanup()));
});
const spec = testSpec({ image: '/' });
const listed = (double: ApptainerDouble): string[] =>
  JSON.parse(spawnSync(double.binary, ['instance', 'list', '--json'], { encoding: 'utf8' }).stdout).instances.map((i: { instance: string }) => i.instance);

describe('apptainer driver', () => {
  it('starts one instance with the documented command line on an overlay image of diskMb, and stop() stops it and removes its host dir', async () => {
    const { double, driver } = setup();
    const sandbox = await driver().start(spec);
    expect(listed(double)).toEqual([sandbox.id]);
    const dir = readdirSync(double.tmpRoot);
    expect(dir).toHaveLength(1);
    const overlay = `${join(double.tmpRoot, dir[0] ?? '')}/overlay.img`;
    const calls = await double.calls();
    expect(calls.find((c) => c.includes('overlay') && c.includes('create'))).toEqual(['--silent', 'overlay', 'create', '--size', '256', '--sparse', '--create-dir', '/work', overlay]);
    expect(calls.find((c) => c.includes('start'))).toEqual([
      '--silent', 'instance', 'start', '--containall', '--no-mount', 'home,cwd,tmp', '--overlay', overlay, '--no-privs',
      '--net', '--network', 'none', '--memory', String(512 * 1024 * 1024), '--pids-limit', '64', '/', sandbox.id,
    ]);
    // The workspace lives in the overlay: what one exec writes there, the next one reads.
    await sandbox.exec(['sh', '-c', 'echo kept > /work/f']);
    expect((await sandbox.exec(['cat', '/work/f'])).stdout).toBe('kept\n');
    await sandbox.stop();
    expect((await double.calls()).at(-1)).toEqual(['--silent', 'instance', 'stop', '--timeout', '2', sandbox.id]);
    expect(listed(double)).toEqual([]);
    expect(readdirSync(double.tmpRoot)).toEqual([]);
  });

  it("with disk 'none', binds a host dir as the workspace over --writable-tmpfs, as before overlays", async () => {
    const { double, driver } = setup();
    const sandbox = await driver({ disk: 'none' }).start(spec);
    try {
      const dir = readdirSync(double.tmpRoot);
      const calls = await double.calls();
      expect(calls.some((c) => c.includes('overlay') && c.includes('create'))).toBe(false);
      expect(calls.find((c) => c.includes('start'))).toEqual([
        '--silent', 'instance', 'start', '--containall', '--no-mount', 'home,cwd,tmp', '--writable-tmpfs', '--no-privs',
        '--net', '--network', 'none', '--memory', String(512 * 1024 * 1024), '--pids-limit', '64',
        '--bind', `${join(double.tmpRoot, dir[0] ?? '')}/work:/work:rw`, '/', sandbox.id,
      ]);
    } finally {
      await sandbox.stop();
    }
  });

  it('makes mount targets inside the workspace in the overlay image, so their binds have somewhere to go', async () => {
    const { double, driver } = setup();
    const source = mkdtempSync(join(double.tmpRoot, '..', 'src-'));
    writeFileSync(join(source, 'data'), 'mounted\n');
    const sandbox = await driver().start({ ...spec, mounts: [{ source, target: '/work/repo' }, { source, target: '/mnt' }] });
    try {
      const create = (await double.calls()).find((c) => c.includes('overlay') && c.includes('create'));
      expect(create?.filter((_, i, all) => all[i - 1] === '--create-dir')).toEqual(['/work', '/work/repo']);
      const r = await sandbox.exec(['cat', '/work/repo/data']); expect(r).toMatchObject({ stdout: 'mounted\n', exitCode: 0 });
    } finally {
      await sandbox.stop();
    }
  });

  for (const refuseOverlay of ['create', 'start'] as const) {
    it(`falls back to a host-dir workspace for the driver's life when apptainer refuses overlay images (at ${refuseOverlay}), and refuses in disk 'overlay'`, async () => {
      const { double, driver } = setup({ refuseOverlay });
      const strict = driver({ disk: 'overlay' });
      await expect(strict.start(spec)).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringMatching(refuseOverlay === 'create' ? /overlay create failed.*mkfs\.ext3/s : /instance start failed.*fuse2fs/s) });
      expect(readdirSync(double.tmpRoot)).toEqual([]);
      expect(listed(double)).toEqual([]);

      const before = (await double.calls()).length;
      const auto = driver();
      const first = await auto.start(spec);
      const second = await auto.start(spec);
      try {
        await first.exec(['sh', '-c', 'echo kept > /work/f']);
        expect((await first.exec(['cat', '/work/f'])).stdout).toBe('kept\n');
        const calls = (await double.calls()).slice(before);
        const starts = calls.filter((c) => c.includes('start'));
        // The refused attempt (if it got as far as a start), then both sandboxes on host dirs; overlay create is not tried again.
        expect(starts.map((c) => c.includes('--overlay'))).toEqual(refuseOverlay === 'start' ? [true, false, false] : [false, false]);
        expect(calls.filter((c) => c.includes('overlay') && c.includes('create'))).toHaveLength(1);
      } finally {
        await first.stop();
        await second.stop();
      }
    });
  }

  it('fails start with a sandbox_error that says what to do when the binary is missing', async () => {
    const driver = new ApptainerDriver({ binary: '/nonexistent/apptainer' });
    await expect(driver.start(spec)).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringMatching(/needs '\/nonexistent\/apptainer' on PATH.*sandbox.driver 'bwrap'/) });
    await expect(driver.reap()).rejects.toMatchObject({ code: 'sandbox_error' });
  });

  it("maps a failing instance start to a sandbox_error with apptainer's stderr, leaving nothing behind", async () => {
    const { double, driver } = setup({ refuseCgroups: true });
    await expect(driver({ limits: 'cgroups' }).start(spec)).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringMatching(/instance start failed.*cgroups v2 delegation/s) });
    expect(readdirSync(double.tmpRoot)).toEqual([]);
    expect(listed(double)).toEqual([]);
  });

  it('falls back to per-process rlimits when apptainer refuses cgroup limits', async () => {
    const { double, driver } = setup({ refuseCgroups: true });
    const sandbox = await driver().start(spec);
    try {
      const starts = (await double.calls()).filter((c) => c.includes('start'));
      expect(starts.map((c) => c.includes('--memory'))).toEqual([true, false]);
      const limits = (await sandbox.exec(['cat', '/proc/self/limits'])).stdout;
      expect(limits).toMatch(new RegExp(`Max address space\\s+${512 * 1024 * 1024}\\s`));
      expect(limits).toMatch(/Max processes\s+64\s/);
    } finally {
      await sandbox.stop();
    }
  });

  it('refuses a spec without an image, and mount paths --bind cannot express', async () => {
    const { driver } = setup();
    await expect(driver().start(testSpec())).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringMatching(/needs an image/) });
    await expect(driver().start({ ...spec, mounts: [{ source: '/a,b', target: '/x' }] })).rejects.toMatchObject({ code: 'environment_error' });
    await expect(driver().start({ ...spec, image: '/nonexistent.sif' })).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringMatching(/does not exist/) });
  });

  it('kills what a timed-out exec left inside the instance', async () => {
    const { double, driver } = setup();
    const sandbox = await driver().start(spec);
    try {
      expect((await sandbox.exec(['sleep', '30'], { timeoutMs: 300 })).timedOut).toBe(true);
      const cleanup = (await double.calls()).at(-1) ?? [];
      expect(cleanup.slice(0, 8)).toEqual(['--silent', 'exec', '--cleanenv', '--pwd', '/', `instance://${sandbox.id}`, '/bin/sh', '-c']);
      expect(cleanup[8]).toMatch(/ROLLOUT_EXEC=[0-9a-f]{16}/);
    } finally {
      await sandbox.stop();
    }
  });

  it('reports an instance that vanished as a sandbox_error, and a missing cwd as invalid_argument', async () => {
    const { double, driver } = setup();
    const sandbox = await driver().start(spec);
    try {
      await expect(sandbox.exec(['true'], { cwd: '/work/nope' })).rejects.toMatchObject({ code: 'invalid_argument' });
      spawnSync(double.binary, ['instance', 'stop', '--force', sandbox.id]);
      await expect(sandbox.exec(['true'])).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringMatching(/no instance found/) });
    } finally {
      await sandbox.stop();
    }
  });

  it('reaps only instances and dirs of dead servers of ours, never a live server’s or a foreign one', async () => {
    const { double, driver } = setup();
    const deadPid = spawnSync('true').pid ?? 0;
    const livePid = process.ppid;
    const names = { dead: `rollout-apt-${deadPid}-0123456789abcdef`, live: `rollout-apt-${livePid}-0123456789abcdef`, foreign: 'mysql' };
    for (const name of Object.values(names)) expect(spawnSync(double.binary, ['instance', 'start', '/', name]).status).toBe(0);
    mkdirSync(join(double.tmpRoot, `rollout-apt-${deadPid}-AbC123`, 'work'), { recursive: true });
    mkdirSync(join(double.tmpRoot, `rollout-apt-${livePid}-AbC123`));
    mkdirSync(join(double.tmpRoot, 'unrelated'));
    expect(await driver().reap()).toEqual({ removed: 2 });
    expect(listed(double).sort()).toEqual([names.foreign, names.live].sort());
    expect(readdirSync(double.tmpRoot).sort()).toEqual([`rollout-apt-${livePid}-AbC123`, 'unrelated'].sort());
  });
});
