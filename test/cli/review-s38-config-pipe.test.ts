import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { readdir, readlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { NODE_FLAGS } from '../../src/cli/node-flags.js';
import { eventually, within } from '../support/wait.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'rollout-config-pipe-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A stack trace line. */
const STACK = /\n\s+at .*\.(ts|js):\d+/;

interface Run {
  child: ChildProcess;
  output(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

const runs: Run[] = [];
afterEach(() => {
  for (const r of runs.splice(0)) if (r.child.exitCode === null && r.child.signalCode === null) r.child.kill('SIGKILL');
});

/**
 * `rollout serve --port 0 ...args`, or with `shell`, that command line run by bash (`exec`ed: the server is the child,
 * and bash's process substitutions `<(...)` are real pipes, as a user's shell makes them).
 */
function serve(args: string[], shell?: string): Run {
  const command = [process.execPath, ...NODE_FLAGS, 'bin/rollout.js', 'serve', '--port', '0', ...args];
  const child = spawn(shell === undefined ? command[0]! : 'bash', shell === undefined ? command.slice(1) : ['-c', `exec ${command.join(' ')} ${shell}`], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ROLLOUT_LOG_LEVEL: 'info' },
  });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
  const run = { child, output: () => out, exited };
  runs.push(run);
  return run;
}

const listening = (r: Run): Promise<void> => eventually(() => r.output().includes('rollout server listening on ') || r.child.exitCode !== null, 'the server to listen', 90_000);

/** Waits until the server holds `path` open (its /proc fd table): it is waiting on the FIFO. */
async function opened(r: Run, path: string): Promise<void> {
  const holds = async (): Promise<boolean> => {
    const fds = await readdir(`/proc/${r.child.pid}/fd`).catch(() => [] as string[]);
    const targets = await Promise.all(fds.map((fd) => readlink(`/proc/${r.child.pid}/fd/${fd}`).catch(() => '')));
    return targets.includes(path);
  };
  await eventually(holds, `the server to open ${path}`, 90_000);
}

/** The drain's grace as the server logged it on SIGTERM: proves the piped config was the one applied. */
async function drainGraceOnSigterm(r: Run): Promise<number> {
  r.child.kill('SIGTERM');
  expect(await within(r.exited, 60_000, 'the server to exit'), r.output()).toEqual({ code: 0, signal: null });
  const line = r.output().split('\n').find((l) => l.includes('"draining: admission stopped"'));
  return (JSON.parse(line!) as { graceMs: number }).graceMs;
}

describe('`serve --config` from a pipe: read when its writer writes and closes, bounded, never blocking signals', () => {
  // Regression: pipes were refused ("a pipe: write the config to a file"), breaking `--config <(jq ...)`.
  it('process substitution, `--config <(...)`, written in two parts and closed', async () => {
    const r = serve([], `--config <(printf '{"drainGraceMs": '; sleep 1; printf '4321}')`);
    await listening(r);
    expect(r.output()).toContain('rollout server listening on ');
    expect(await drainGraceOnSigterm(r)).toBeLessThanOrEqual(4321);
  }, 180_000);

  it('a named FIFO whose writer comes after the server opened it', async () => {
    const fifo = join(dir, 'late-writer.fifo');
    execFileSync('mkfifo', [fifo]);
    const r = serve(['--config', fifo]);
    // The server is waiting on the FIFO (it has not started): only then does the writer come.
    await opened(r, fifo);
    expect(r.output()).not.toContain('listening');
    await writeFile(fifo, JSON.stringify({ drainGraceMs: 2345 }));
    await listening(r);
    expect(r.output()).toContain('rollout server listening on ');
    expect(await drainGraceOnSigterm(r)).toBeLessThanOrEqual(2345);
  }, 180_000);

  it('a FIFO nobody writes to: one line naming --config after the deadline, exit 2, no stack trace', async () => {
    const fifo = join(dir, 'no-writer.fifo');
    execFileSync('mkfifo', [fifo]);
    const r = serve(['--config', fifo]);
    expect(await within(r.exited, 120_000, 'the server to give up on the FIFO'), r.output()).toEqual({ code: 2, signal: null });
    expect(STACK.test(r.output())).toBe(false);
    expect(r.output()).toBe(`rollout: --config ${fifo}: the pipe was not written and closed within 30 s (0 bytes so far): is anything writing to it?\n`);
  }, 180_000);

  it('a SIGTERM while the server waits for the FIFO ends it at once', async () => {
    const fifo = join(dir, 'signalled.fifo');
    execFileSync('mkfifo', [fifo]);
    const r = serve(['--config', fifo]);
    await opened(r, fifo);
    r.child.kill('SIGTERM');
    expect(await within(r.exited, 30_000, 'the server to end on SIGTERM')).toEqual({ code: null, signal: 'SIGTERM' });
  }, 180_000);

  it('/dev/stdin, a pipe', async () => {
    const r = serve([], `--config /dev/stdin < <(printf '{"drainGraceMs": 3456}')`);
    await listening(r);
    expect(r.output()).toContain('rollout server listening on ');
    expect(await drainGraceOnSigterm(r)).toBeLessThanOrEqual(3456);
  }, 180_000);

  it('a pipe carrying more than a config may: refused naming the file, exit 2', async () => {
    const r = serve([], `--config /dev/stdin < <(head -c 16777217 /dev/zero | tr '\\0' ' ')`);
    expect(await within(r.exited, 120_000, 'the server to refuse the config'), r.output()).toEqual({ code: 2, signal: null });
    expect(r.output()).toBe("rollout: config file /dev/stdin is more than a config's 16777216 bytes: is it the right file?\n");
  }, 180_000);

  // Regression: the open's own words, "ENXIO: no such device or address", said nothing a person could act on.
  it('/dev/stdin that is a socket (a node parent\'s stdio pipe): one line saying so, exit 2', async () => {
    const child = spawn(process.execPath, [...NODE_FLAGS, 'bin/rollout.js', 'serve', '--port', '0', '--config', '/dev/stdin'], { cwd: root, stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    child.stdin.on('error', () => undefined);
    child.stdin.end('{}');
    const code = await within(new Promise<number | null>((resolve) => child.on('close', resolve)), 90_000, 'the server to exit');
    expect({ code, out }).toEqual({ code: 2, out: 'rollout: config file /dev/stdin is a socket, which cannot be opened by its path: pass the config in a file or a pipe\n' });
  }, 180_000);
});
