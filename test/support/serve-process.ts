import { spawn, type ChildProcess } from 'node:child_process';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { NODE_FLAGS } from '../../src/cli/node-flags.js';
import { eventually } from './wait.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

/** `node bin/rollout.js serve ...` as an operator runs it: a real process with its own signals and exit code. */
export interface ServeProcess {
  readonly child: ChildProcess;
  readonly pid: number;
  readonly address: string;
  output(): string;
  /** The exit code (null when killed by a signal). */
  readonly exited: Promise<number | null>;
  /** SIGKILLs the process if it is still running (test cleanup). */
  kill(): void;
}

/** Starts `rollout serve --port 0 <args>` and resolves once it printed its address. */
export async function startServeProcess(args: readonly string[], env: Record<string, string> = {}): Promise<ServeProcess> {
  const child = spawn(process.execPath, [...NODE_FLAGS, 'bin/rollout.js', 'serve', '--port', '0', ...args], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ROLLOUT_LOG_LEVEL: 'info', ...env },
  });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  let address: string | undefined;
  let done = false;
  void exited.then(() => (done = true));
  await eventually(() => {
    address = /rollout server listening on (\S+)/.exec(out)?.[1];
    if (done && !address) throw new Error(`rollout serve exited before listening:\n${out}`);
    return address !== undefined;
  }, 'rollout serve to listen', 60_000);
  return {
    child,
    pid: child.pid!,
    address: address!,
    output: () => out,
    exited,
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
