import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox, SandboxDriver, SandboxLimits, SandboxSpec } from '../../src/sandboxes/types.js';
import { findHostProcessesWithEnv, isAlive, testSpec, waitFor } from './helpers.js';

export interface ConformanceOptions {
  /** Why the suite cannot run here (e.g. "apptainer is not on PATH"); the suite is then reported as skipped. */
  skip?: string;
  /** The root file system every sandbox of the suite uses (undefined: the driver's host layout). */
  image?: string;
  /** Why the disk quota cannot be checked here (a test double that keeps files in host dirs); the test is skipped. */
  noDiskQuota?: string;
  /**
   * For a driver that reads files with a reader of its own rather than the image's `cat`/`head`/`dd` (bubblewrap's
   * sandbox init, `--read-file`), which the killed-reader test cannot replace through PATH: a driver whose reader
   * SIGKILLs itself (a TEST DOUBLE of it), used by that test instead of `makeDriver`.
   */
  makeKilledReaderDriver?: () => SandboxDriver;
}

/**
 * The behaviour every SandboxDriver promises (src/sandboxes/types.ts), as one vitest suite to run against each
 * driver: exec (streams, exit code, stdin, env, cwd, timeout, cancel, output cap), files (write, read, list, errors),
 * spawn, no network unless asked, no writes outside the workspace, the wall clock, and a stop that leaves no
 * process alive. Driver-agnostic: it uses only the interface, `sh` and coreutils inside the sandbox, and host-side
 * observation (/proc) — never a driver's internals.
 *
 * @example
 * describeSandboxConformance('bubblewrap', () => new BubblewrapDriver());
 * describeSandboxConformance('apptainer', () => new ApptainerDriver(), { skip: onPath ? undefined : 'apptainer is not on PATH', image });
 */
export function describeSandboxConformance(name: string, makeDriver: () => SandboxDriver, options: ConformanceOptions = {}): void {
  const title = `sandbox conformance: ${name}${options.skip ? ` — SKIPPED: ${options.skip}` : ''}`;
  const spec = (overrides: Partial<SandboxLimits> & { network?: boolean; env?: Record<string, string> } = {}): SandboxSpec => {
    const { env, ...rest } = overrides;
    return { ...testSpec({ ...rest, ...(options.image !== undefined && { image: options.image }) }), env: env ?? {} };
  };

  describe.skipIf(options.skip !== undefined)(title, () => {
    let driver: SandboxDriver;
    let sandbox: Sandbox;

    beforeAll(async () => {
      driver = makeDriver();
      sandbox = await driver.start({ ...spec({ outputLimitBytes: 4096 }), env: { CONF_SPEC: 'a,b $HOME "q"' } });
    });
    afterAll(async () => {
      await sandbox?.stop();
      await driver?.close?.();
    });

    it('separates stdout, stderr and the exit code', async () => {
      const r = await sandbox.exec(['sh', '-c', 'echo out; echo err >&2; exit 3']);
      expect(r).toMatchObject({ exitCode: 3, signal: null, stdout: 'out\n', stderr: 'err\n', timedOut: false, truncated: false });
    });

    it('passes stdin, the spec env and per-call env byte for byte, and runs in the workspace (also HOME) by default', async () => {
      const r = await sandbox.exec(['sh', '-c', 'cat; printf "|%s|%s|%s|%s" "$CONF_SPEC" "$CONF_CALL" "$PWD" "$HOME"'], { stdin: 'in\n', env: { CONF_CALL: '=x, y' } });
      expect(r.stdout).toBe(`in\n|a,b $HOME "q"|=x, y|${sandbox.workdir}|${sandbox.workdir}`);
    });

    it('runs in a given directory of the workspace', async () => {
      await sandbox.exec(['mkdir', '-p', 'sub/dir']);
      expect((await sandbox.exec(['pwd'], { cwd: `${sandbox.workdir}/sub/dir` })).stdout).toBe(`${sandbox.workdir}/sub/dir\n`);
    });

    it('kills a command at its timeout and stays usable', async () => {
      const r = await sandbox.exec(['sh', '-c', 'echo before; sleep 30'], { timeoutMs: 500 });
      expect(r).toMatchObject({ timedOut: true, exitCode: null });
      expect(r.durationMs).toBeLessThan(10_000);
      expect((await sandbox.exec(['echo', 'after'])).stdout).toBe('after\n');
    });

    it('cancels a command when its signal aborts, and stays usable', async () => {
      const controller = new AbortController();
      setTimeout(() => controller.abort(), 300);
      await expect(sandbox.exec(['sleep', '30'], { signal: controller.signal })).rejects.toMatchObject({ code: 'cancelled' });
      expect((await sandbox.exec(['echo', 'after'])).stdout).toBe('after\n');
    });

    it('caps output at the limit and says it did', async () => {
      const r = await sandbox.exec(['sh', '-c', "head -c 200000 /dev/zero | tr '\\000' a"]);
      expect(r.stdout).toBe('a'.repeat(4096));
      expect(r.truncated).toBe(true);
      expect(r.exitCode).toBe(0);
    });

    it('writes, reads and lists files in the workspace, which commands see', async () => {
      await sandbox.writeFile('conf/a.txt', 'é, ok\n');
      expect(await sandbox.readFile('conf/a.txt')).toBe('é, ok\n');
      expect(await sandbox.readFile(`${sandbox.workdir}/conf/a.txt`)).toBe('é, ok\n');
      expect((await sandbox.exec(['cat', 'conf/a.txt'])).stdout).toBe('é, ok\n');
      await sandbox.writeFile('conf/a.txt', 'short');
      expect(await sandbox.readFile('conf/a.txt')).toBe('short');
      await sandbox.exec(['sh', '-c', 'mkdir conf/d && printf 12345 > conf/b.txt']);
      expect(await sandbox.listDir('conf')).toEqual([
        { name: 'a.txt', type: 'file', size: 5 },
        { name: 'b.txt', type: 'file', size: 5 },
        { name: 'd', type: 'dir', size: 0 },
      ]);
      expect((await sandbox.listDir(sandbox.workdir)).map((e) => e.name)).toContain('conf');
    });

    it('refuses to read a directory and reports a missing file as not_found', async () => {
      await sandbox.exec(['mkdir', '-p', 'adir']);
      await expect(sandbox.readFile('adir')).rejects.toMatchObject({ code: 'invalid_argument' });
      await expect(sandbox.readFile('missing.txt')).rejects.toMatchObject({ code: 'not_found' });
      await expect(sandbox.listDir('conf/a.txt')).rejects.toMatchObject({ code: 'invalid_argument' });
    });

    it('refuses to list a directory too large to parse on the event loop, as a path the model named', async () => {
      // 10,000 names of ~28 bytes: ~330 KB of listing, over MAX_LIST_BYTES (the model can make 600,000 with one loop).
      await sandbox.exec(['sh', '-c', 'mkdir -p big && cd big && seq 10000 | sed "s/^/entry-with-a-long-name-/" | xargs touch']);
      await expect(sandbox.listDir('big')).rejects.toMatchObject({ code: 'invalid_argument', message: expect.stringMatching(/too many entries/) });
      await sandbox.exec(['sh', '-c', 'rm -rf big']);
    });

    it('names the directory it cannot enter when a command\'s cwd is unusable, the default workspace included', async () => {
      await sandbox.writeFile('not-a-dir', 'x');
      await expect(sandbox.exec(['true'], { cwd: 'not-a-dir' })).rejects.toMatchObject({
        code: 'invalid_argument',
        message: `cwd: ${sandbox.workdir}/not-a-dir is not a directory or cannot be entered`,
      });
      // The model can make its own workspace unenterable: then the default cwd is what is named, never "". (Not where
      // commands run as root, who enters a chmod 000 directory: the apptainer TEST DOUBLE.)
      await sandbox.exec(['chmod', '000', sandbox.workdir], { cwd: '/' });
      try {
        const root = (await sandbox.exec(['id', '-u'], { cwd: '/' })).stdout === '0\n';
        for (const options of root ? [] : [{}, { cwd: '' }]) {
          await expect(sandbox.exec(['true'], options)).rejects.toMatchObject({ code: 'invalid_argument', message: `cwd: ${sandbox.workdir} is not a directory or cannot be entered` });
        }
      } finally {
        await sandbox.exec(['chmod', '755', sandbox.workdir], { cwd: '/' });
      }
    });

    it('refuses a file over the read limit without reading it through, even an endless pseudo-file', async () => {
      // /proc/self/pagemap is hundreds of GiB of zeros to a reader: sizing it by reading it all took the whole command
      // timeout (30 s here) before it was refused.
      const started = performance.now();
      await expect(sandbox.readFile('/proc/self/pagemap', { maxBytes: 1 << 20 })).rejects.toMatchObject({ code: 'invalid_argument', message: expect.stringMatching(/over the .*limit/) });
      expect(performance.now() - started).toBeLessThan(10_000);
      // Pseudo-files within the limit (stat says 0 bytes) are still read whole.
      expect(await sandbox.readFile('/proc/self/status')).toMatch(/^Name:/);
    });

    it('ends a command when it exits, with its status and output, though a process it left running holds its output open', async () => {
      const r = await sandbox.exec(['sh', '-c', 'sleep 60 & echo done; exit 3'], { timeoutMs: 20_000 });
      expect(r).toMatchObject({ exitCode: 3, stdout: 'done\n', timedOut: false });
      expect(r.durationMs).toBeLessThan(10_000);
      expect((await sandbox.exec(['echo', 'after'])).stdout).toBe('after\n');
    });

    it('fails a file read whose reader was killed by a signal (e.g. the OOM killer) as sandbox_error with a cause, not as the path\'s fault', async () => {
      // A stand-in for the OOM killer: the spec's PATH finds readers (`cat`, `head`, `dd`) in the workspace that SIGKILL
      // themselves once they read a file (dd's capability probes, of /dev/null, are the real dd's: the driver reads with
      // dd where it can, and the reader killed must be that one).
      const killed = await (options.makeKilledReaderDriver ?? makeDriver)().start(spec({ env: { PATH: `${sandbox.workdir}/bin:/usr/local/bin:/usr/bin:/bin` } }));
      try {
        await killed.writeFile('data.txt', 'hello');
        for (const reader of ['cat', 'head']) await killed.writeFile(`bin/${reader}`, '#!/bin/sh\nkill -KILL $$\n');
        await killed.writeFile('bin/dd', '#!/bin/sh\ncase "$1" in if=/dev/null|of=/dev/null) PATH=/usr/local/bin:/usr/bin:/bin exec dd "$@" ;; esac\nkill -KILL $$\n');
        await killed.exec(['chmod', '+x', 'bin/cat', 'bin/head', 'bin/dd']);
        const failure = killed.readFile('data.txt');
        await expect(failure).rejects.toMatchObject({ code: 'sandbox_error', message: expect.stringMatching(/data\.txt.*killed by SIGKILL/) });
        await expect(failure).rejects.toHaveProperty('cause');
      } finally {
        await killed.stop();
      }
    });

    it('has no network unless the spec asks (loopback only)', async () => {
      expect(interfaces((await sandbox.exec(['cat', '/proc/net/dev'])).stdout)).toEqual(['lo']);
    });

    it('writes nothing to the host outside the workspace', async () => {
      const outside = await mkdtemp(join(tmpdir(), 'conformance-outside-'));
      const token = `conformance-escape-${process.pid}-${Date.now()}`;
      try {
        await sandbox.exec(['sh', '-c', `mkdir -p ${outside}; echo x > ${outside}/escape; echo x > /tmp/${token}; echo x > /${token}`]);
        expect(existsSync(join(outside, 'escape'))).toBe(false);
        expect(existsSync(join('/tmp', token))).toBe(false);
        expect(existsSync(join('/', token))).toBe(false);
      } finally {
        await rm(outside, { recursive: true, force: true });
        await rm(join('/tmp', token), { force: true });
        await rm(join('/', token), { force: true }).catch(() => undefined);
      }
    });

    it.skipIf(options.noDiskQuota !== undefined)(`holds the workspace to diskMb: a write past it fails (ENOSPC), the sandbox lives on${options.noDiskQuota ? ` — SKIPPED: ${options.noDiskQuota}` : ''}`, async () => {
      const small = await makeDriver().start(spec({ diskMb: 8, maxFileMb: 64 }));
      try {
        const full = await small.exec(['sh', '-c', 'head -c 33554432 /dev/zero > big; echo "exit $?"; wc -c < big']);
        expect(full.stdout).toMatch(/^exit [1-9]\d*\n/);
        expect(full.stderr).toMatch(/No space left on device/);
        expect(Number(full.stdout.split('\n')[1])).toBeLessThanOrEqual(8 * 1024 * 1024);
        // Freed space is usable again: the quota is of what is there, not of what was ever written.
        expect(await small.exec(['sh', '-c', 'rm big && head -c 1048576 /dev/zero > again && wc -c < again'])).toMatchObject({ exitCode: 0, stdout: '1048576\n' });
      } finally {
        await small.stop();
      }
    });

    it('spawns a long-lived process with open pipes and kills it on request', async () => {
      const proc = sandbox.spawn(['cat']);
      const got = new Promise<string>((resolve) => proc.stdout.once('data', (chunk: Buffer) => resolve(chunk.toString())));
      proc.stdin.write('hello\n');
      expect(await got).toBe('hello\n');
      proc.kill();
      const exit = await proc.exited;
      expect(exit.exitCode === null || exit.exitCode !== 0).toBe(true);
    });

    it('gives the network when the spec asks (an interface besides loopback)', async () => {
      const networked = await makeDriver().start(spec({ network: true }));
      try {
        // Which one is the driver's: the host's own (Apptainer, bubblewrap under networkMode 'host') or slirp4netns's
        // tap0 (bubblewrap's default, review-s39-isolated-network.test.ts).
        const inside = interfaces((await networked.exec(['cat', '/proc/net/dev'])).stdout);
        expect(inside).toContain('lo');
        expect(inside.filter((i) => i !== 'lo').length).toBeGreaterThan(0);
      } finally {
        await networked.stop();
      }
    });

    it('fails commands past the wall clock with deadline_exceeded', async () => {
      const short = await makeDriver().start(spec({ wallClockMs: 1500 }));
      try {
        const late = new Promise((resolve) => setTimeout(resolve, 2000));
        await late;
        await expect(short.exec(['true'])).rejects.toMatchObject({ code: 'deadline_exceeded' });
      } finally {
        await short.stop();
      }
    });

    it('stop kills every process of the sandbox, is idempotent, and later calls fail', async () => {
      const doomed = await makeDriver().start(spec());
      const token = `conf-${process.pid}-${Date.now()}`;
      const proc = doomed.spawn(['sh', '-c', 'sleep 1000 & sleep 1000'], { env: { CONF_TOKEN: token } });
      await waitFor(() => findHostProcessesWithEnv('CONF_TOKEN', token).length >= 2, 10_000, 'the sandbox processes');
      const procs = findHostProcessesWithEnv('CONF_TOKEN', token);
      await doomed.stop();
      await waitFor(() => procs.every((p) => !isAlive(p)), 10_000, 'every sandbox process to die');
      await proc.exited;
      await doomed.stop();
      await expect(doomed.exec(['true'])).rejects.toMatchObject({ code: 'sandbox_error' });
    });
  });
}

/** Interface names of a /proc/net/dev listing, sorted. */
function interfaces(procNetDev: string): string[] {
  return procNetDev
    .split('\n')
    .slice(2)
    .map((line) => line.split(':')[0]?.trim() ?? '')
    .filter((n) => n !== '')
    .sort();
}
