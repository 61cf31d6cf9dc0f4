import { spawn } from 'node:child_process';
import { accessSync, chmodSync, constants, mkdtempSync, rmSync, statSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { networkInterfaces, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

// Review s39: a server running as a NON-ROOT user could start a bubblewrap sandbox but never enter it: every command,
// file operation and the shell failed with "nsenter: reassociate to namespace 'ns/cgroup' failed: Operation not
// permitted". bwrap's --disable-userns runs the sandbox in a user namespace nested in the one that owns its mount, PID,
// network, ... namespaces, and joining the nested one first gives no capability over them. Commands now join the
// owning user namespace first (held since start), then the rest, then the nested one as the sandbox's uid.
//
// The test process is root here (as in CI), so a stand-in server (review-s39-rootless-cli.ts) runs under
// `setpriv --reuid` as an unused uid and reports what each operation gave.
//
// slirp4netns (network: true) opens /dev/net/tun as the server's uid: distributions ship it crw-rw-rw-, but a container
// may give it to root only (crw------- here), where no non-root server can have an isolated network. Then the
// stand-in runs in a private mount namespace of its own (unshare -m) where /dev/net/tun is a crw-rw-rw- node of the same
// device: the host's as distributions have it, the host's /dev untouched.

const UID = 4242;
const setprivPath = ['/usr/bin/setpriv', '/bin/setpriv', '/usr/sbin/setpriv'].find((p) => {
  try {
    accessSync(p, constants.X_OK);
    return true;
  } catch {
    return false;
  }
});
const skipReason =
  process.getuid?.() !== 0 ? 'the test process is not root (it needs root to run a server stand-in as another uid)'
  : setprivPath === undefined ? 'setpriv (util-linux) is not installed'
  : undefined;
// Under CI (which runs tests as root) with setpriv there, nothing skips: a non-root test process fails instead.
const skip = skipReason !== undefined && !(process.env.CI === 'true' && setprivPath !== undefined);
const skipNote = skip ? ` — SKIPPED: ${skipReason}` : '';

const root = fileURLToPath(new URL('../..', import.meta.url));
const cli = fileURLToPath(new URL('./review-s39-rootless-cli.ts', import.meta.url));
/** A non-loopback IPv4 address of this host, which an isolated sandbox must not reach (refused inside it since review s40). */
const hostAddress = Object.values(networkInterfaces()).flat().find((a) => a !== undefined && a.family === 'IPv4' && !a.internal)?.address;

interface Report {
  uid: number;
  capabilities: { identity: string; cgroups: string; holderIsInit: boolean; ptyLimit: boolean };
  [step: string]: unknown;
}

describe.skipIf(skip)(`bubblewrap sandboxes of a server that is not root${skipNote}`, () => {
  let home: string;
  let server: Server;
  let port = 0;
  let report: Report;

  beforeAll(async () => {
    // The stand-in's HOME (tsx's cache) must be its own: a temp dir it owns, under a parent it can pass through.
    home = mkdtempSync(join(tmpdir(), 'rootless-'));
    chmodSync(home, 0o777);
    server = createServer((socket) => socket.end('hello from the host\n'));
    await new Promise<void>((resolve) => server.listen(0, hostAddress ?? '127.0.0.1', resolve));
    port = (server.address() as { port: number }).port;
    const standIn = [setprivPath!, `--reuid=${UID}`, `--regid=${UID}`, '--clear-groups', '--', process.execPath, '--import', 'tsx', cli, hostAddress ?? '-', String(port)];
    const tunForAll = (statSync('/dev/net/tun', { throwIfNoEntry: false })?.mode ?? 0o666) & 0o006;
    const argv = tunForAll === 0o006 ? standIn : [
      'unshare', '--mount', '--propagation', 'private', '/bin/sh', '-c',
      'mknod "$1/tun" c 10 200 && chmod 0666 "$1/tun" && mount --bind "$1/tun" /dev/net/tun && shift && exec "$@"', 'tun-for-all', home, ...standIn,
    ];
    const child = spawn(argv[0]!, argv.slice(1), {
      cwd: root, env: { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: home, LANG: 'C.UTF-8' }, stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
    if (code !== 0) throw new Error(`the stand-in server exited ${code}: ${stderr.slice(-2000)}`);
    report = JSON.parse(stdout.trim().split('\n').pop()!) as Report;
  });

  afterAll(async () => {
    await new Promise((resolve) => server?.close(resolve));
    if (home) rmSync(home, { recursive: true, force: true });
  });

  it('runs as the unprivileged uid in the user-namespace identity, without cgroups', () => {
    expect(report.uid).toBe(UID);
    expect(report.capabilities.identity).toBe('userns');
    expect(report.capabilities.cgroups).toBe('none');
    // The pty limit's devpts mount is made through the same owning user namespace.
    if (report.capabilities.holderIsInit) expect(report.capabilities.ptyLimit).toBe(true);
  });

  it('execs as the sandbox uid, and the sandbox cannot create user namespaces', () => {
    expect(report.exec).toBe('1000\n1000\nhi\n');
    expect(report.unshareUser).not.toBe(0);
    expect(typeof report.unshareUser).toBe('number');
    expect(report.fds).toBe('0 1 2');
  });

  it('holds memory, file size and core limits per process (no cgroups)', () => {
    expect(report.limits).toBe(`${512 * 1024} ${16 * 1024} 0`);
  });

  it('writes, reads and lists files as the sandbox user', () => {
    expect(report.write).toBe('ok');
    expect(report.read).toBe('rootless\n');
    expect(report.list).toEqual(['a.txt']);
    expect(report.owner).toBe('1000');
  });

  it('runs the persistent shell', () => {
    expect(report.shell).toEqual({ exitCode: 0, output: '42 /work/notes rootless', cwd: '/work/notes' });
  });

  it('keeps network: false sandboxes on their own loopback, and stops them', () => {
    expect(report.interfaces).toBe('lo');
    expect(JSON.stringify(report.afterStop)).toMatch(/stopped/);
  });

  it('gives network: true sandboxes an isolated network through slirp4netns', () => {
    expect(report.netStart).toBe('ok');
    expect(report.netInterfaces).toBe('lo tap0');
    expect(report.netExec).toBe('1000');
    // Review s40: the host's own addresses are refused inside the sandbox (review-s40-private-network.test.ts).
    if (hostAddress !== undefined) expect(report.netConnect).toMatch(/Permission denied/);
  });
});
