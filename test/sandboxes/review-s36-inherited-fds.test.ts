import { spawn } from 'node:child_process';
import { closeSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { bashFdCloser, initFdCloser, type FdCloser } from '../../src/sandboxes/fd-closer.js';
import { DEFAULT_SANDBOX_INIT } from '../../src/sandboxes/init/sandbox-init.js';
import { makeApptainerDouble } from './apptainer-double.js';

const cli = fileURLToPath(new URL('./review-s36-fd-cli.ts', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'review-s36-fds-'));
const marker = join(dir, 'inherited-host-file');
writeFileSync(marker, 'host secret\n');
const double = makeApptainerDouble();
afterAll(async () => {
  await double.cleanup();
  rmSync(dir, { recursive: true, force: true });
});

/** `N -> target` of each descriptor in an `ls -l /proc/PID/fd` listing. */
function descriptors(listing: string): Map<number, string> {
  const out = new Map<number, string>();
  for (const line of listing.split('\n')) {
    const m = / (\d+) -> (.*)$/.exec(line);
    if (m) out.set(Number(m[1]), m[2]!);
  }
  return out;
}

/**
 * Runs review-s36-fd-cli.ts (a server stand-in) holding descriptors it inherited WITHOUT close-on-exec, as a
 * supervisor's or harness's pipe reaches a server: fd 3 and 20 on a host file, fd 251 a socket to this process.
 */
async function listingsFromAServerWithInheritedFds(which: string): Promise<Record<string, Map<number, string>>> {
  const fd = openSync(marker, 'r');
  try {
    const stdio: Array<'ignore' | 'pipe' | 'inherit' | number> = Array(252).fill('ignore');
    stdio[1] = 'pipe';
    stdio[2] = 'inherit';
    stdio[3] = fd;
    stdio[20] = fd;
    stdio[251] = 'pipe';
    const child = spawn(process.execPath, ['--import', 'tsx', cli, which], { stdio });
    let out = '';
    child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
    const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
    expect(code).toBe(0);
    const json = JSON.parse(out) as Record<string, string>;
    return Object.fromEntries(Object.entries(json).map(([k, v]) => [k, descriptors(v)]));
  } finally {
    closeSync(fd);
  }
}

function expectNoHostDescriptor(fds: Map<number, string>): void {
  for (const [fd, target] of fds) {
    expect(target, `fd ${fd}`).not.toContain('inherited-host-file');
    expect([3, 20, 251], `fd ${fd} -> ${target}`).not.toContain(fd);
  }
}

// Review s36: descriptors the server inherited without close-on-exec (a harness's pipe, fd 251, was once seen inside a
// sandbox) went through spawn, bwrap, nsenter and apptainer into every sandboxed process, which could read or write
// them; so did the namespace descriptors nsenter is given (4..11).
describe('descriptors the server inherited never reach a sandboxed process', () => {
  it('bubblewrap: one-shot exec, spawned process and persistent shell have 0, 1 and 2 only', async () => {
    const seen = await listingsFromAServerWithInheritedFds('bwrap');
    expect([...seen.exec!.keys()].sort((a, b) => a - b)).toEqual([0, 1, 2]);
    expect([...seen.spawn!.keys()].sort((a, b) => a - b)).toEqual([0, 1, 2]);
    // The shell lists itself inside its own frame (`{ ... eval ... >&0 </dev/null 2>&1 ...} 0>&1 >/dev/null 2>&1`):
    // meanwhile bash keeps copies of what those redirections replaced — its own stdin, stdout and stderr at 10, 11
    // and 12, the frame's /dev/null stdout, its stdout carried on 0 and its /dev/null stderr at 13, 14 and 15
    // (close-on-exec, so no command inherits them). Nothing else is open.
    const shell = seen.shell!;
    expect([...shell.keys()].sort((a, b) => a - b)).toEqual([0, 1, 2, 10, 11, 12, 13, 14, 15]);
    for (const fd of [10, 11, 12, 14]) expect(shell.get(fd)).toMatch(/^(socket|pipe):/);
    expect(shell.get(13)).toBe('/dev/null');
    expect(shell.get(15)).toBe('/dev/null');
    for (const fds of Object.values(seen)) expectNoHostDescriptor(fds);
  }, 120_000);

  it('bubblewrap without the sandbox init (bwrap\'s init and a holder shell): no host descriptor either', async () => {
    const seen = await listingsFromAServerWithInheritedFds('bwrap-no-init');
    for (const fds of Object.values(seen)) expectNoHostDescriptor(fds);
  }, 120_000);

  it('apptainer driver (over the apptainer TEST DOUBLE): exec and spawned process have 0, 1 and 2 only', async () => {
    const seen = await listingsFromAServerWithInheritedFds(`apptainer:${double.binary}:${double.tmpRoot}`);
    expect([...seen.exec!.keys()].sort((a, b) => a - b)).toEqual([0, 1, 2]);
    expect([...seen.spawn!.keys()].sort((a, b) => a - b)).toEqual([0, 1, 2]);
  }, 120_000);
});

describe.each<[string, FdCloser]>([
  ['the sandbox init binary', initFdCloser(DEFAULT_SANDBOX_INIT)],
  ['bash (no init binary)', bashFdCloser('/bin/bash')],
])('the descriptor closer: %s', (_name, closer) => {
  it('keeps 0, 1, 2 and the listed descriptors, closes the rest, and runs the command', async () => {
    const fd = openSync(marker, 'r');
    try {
      const stdio: Array<'ignore' | 'pipe' | number> = Array(252).fill('ignore');
      stdio[1] = 'pipe';
      for (const n of [3, 5, 7, 20]) stdio[n] = fd;
      stdio[251] = 'pipe';
      const argv = closer.wrap([5, 20], ['sh', '-c', 'ls -l /proc/$$/fd; exit 3']);
      const child = spawn(argv[0]!, argv.slice(1), { stdio });
      let out = '';
      child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
      const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
      expect(code).toBe(3);
      expect([...descriptors(out).keys()].sort((a, b) => a - b)).toEqual([0, 1, 2, 5, 20]);
    } finally {
      closeSync(fd);
    }
  });

  it('says why it cannot run a missing command (127), as a shell would', async () => {
    const argv = closer.wrap([], ['/nonexistent/rollout-command']);
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    child.stderr!.on('data', (c: Buffer) => (err += c.toString()));
    expect(await new Promise((resolve) => child.once('close', resolve))).toBe(127);
    expect(err).toMatch(/rollout-command.*No such file/);
  });
});
