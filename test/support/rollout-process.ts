import { spawn, type ChildProcess } from 'node:child_process';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { NODE_FLAGS } from '../../src/cli/node-flags.js';
import { eventually } from './wait.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

/**
 * A `rollout serve` child process as an operator runs it (its own signals and exit code): its address once it
 * listens, its output (JSON logs included), its exit.
 */
export interface ServeProcess {
  child: ChildProcess;
  pid: number;
  address: string;
  output(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** The parsed JSON log lines whose `msg` is this. */
  logs(msg: string): Record<string, unknown>[];
  /** SIGKILLs the process if it is still running (test cleanup). */
  kill(): void;
}

/** Spawns `node bin/rollout.js serve --port 0 ...args` and waits for its "listening" line. */
export async function spawnServe(args: string[], env: Record<string, string> = {}): Promise<ServeProcess> {
  const child = spawn(process.execPath, [...NODE_FLAGS, 'bin/rollout.js', 'serve', '--port', '0', ...args], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ROLLOUT_LOG_LEVEL: 'info', ...env },
  });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
  let gone = false;
  void exited.then(() => (gone = true));
  await eventually(() => gone || /rollout server listening on (\S+)/.test(out), 'the server to listen', 60_000);
  const match = out.match(/rollout server listening on (\S+)/);
  if (!match) throw new Error(`rollout serve exited before listening:\n${out}`);
  return {
    child,
    pid: child.pid!,
    address: match[1]!,
    output: () => out,
    exited,
    logs: (msg) =>
      out
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .filter((l) => l.msg === msg),
    kill: () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    },
  };
}

const SANDBOX_CGROUPS = '/sys/fs/cgroup/pids/rollout-sandboxes';

/** The bubblewrap sandboxes process `pid` owns on the host (their cgroups), with the pids in each (nested cgroups too). */
export async function sandboxesOf(pid: number): Promise<{ name: string; pids: number[] }[]> {
  const owners = (await readdir(SANDBOX_CGROUPS).catch(() => [] as string[])).filter((o) => o.startsWith(`${pid}-`));
  const found: { name: string; pids: number[] }[] = [];
  for (const owner of owners) {
    const entries = await readdir(join(SANDBOX_CGROUPS, owner), { withFileTypes: true }).catch(() => []);
    for (const entry of entries.filter((e) => e.isDirectory())) {
      found.push({ name: `${owner}/${entry.name}`, pids: await pidsUnder(join(SANDBOX_CGROUPS, owner, entry.name)) });
    }
  }
  return found;
}

async function pidsUnder(dir: string): Promise<number[]> {
  const procs = await readFile(join(dir, 'cgroup.procs'), 'utf8').catch(() => '');
  const own = procs.split('\n').filter(Boolean).map(Number);
  const children = (await readdir(dir, { withFileTypes: true }).catch(() => [])).filter((e) => e.isDirectory());
  const nested = await Promise.all(children.map((c) => pidsUnder(join(dir, c.name))));
  return [...own, ...nested.flat()];
}

/**
 * Whether a process with this pid is still running. A zombie (state Z) has exited and holds nothing but its pid
 * entry: it is not counted, since reaping orphans is the host init's job (on some hosts PID 1 never reaps, and
 * bubblewrap's in-namespace init, orphaned when its parent exits, stays a zombie there).
 */
export async function pidAlive(pid: number): Promise<boolean> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => undefined);
  if (stat === undefined) return false;
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0] !== 'Z';
}

/** Runs `node bin/rollout.js ...args` (warnings logged) to its end: its exit code and its stdout and stderr together. */
export async function runRollout(args: string[]): Promise<{ code: number | null; output: string }> {
  const child = spawn(process.execPath, ['bin/rollout.js', ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ROLLOUT_LOG_LEVEL: 'warn' } });
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
  return { code, output };
}
