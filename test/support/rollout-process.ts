import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { NODE_FLAGS } from '../../src/cli/node-flags.js';
import { eventually } from './wait.js';

const root = fileURLToPath(new URL('../../', import.meta.url));

/** A `rollout serve` child process: its address once it listens, its output (JSON logs included), its exit. */
export interface ServeProcess {
  child: ChildProcess;
  address: string;
  output(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** The parsed JSON log lines whose `msg` is this. */
  logs(msg: string): Record<string, unknown>[];
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
    address: match[1]!,
    output: () => out,
    exited,
    logs: (msg) =>
      out
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .filter((l) => l.msg === msg),
  };
}
