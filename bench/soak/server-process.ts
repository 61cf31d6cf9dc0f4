import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, type WriteStream } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { NODE_FLAGS } from '../../src/cli/node-flags.js';

const REPO_ROOT = fileURLToPath(new URL('../..', import.meta.url));
const SERVER_SCRIPT = fileURLToPath(new URL('./server.ts', import.meta.url));

export interface ServerProcessOptions {
  configPath: string;
  runTag: string;
  journalDir?: string;
  /** Where the server's stdout and stderr go (appended; both servers of a run share it). */
  logPath: string;
  startTimeoutMs?: number;
}

/**
 * One rollout server as a real OS process (bench/soak/server.ts: `rollout serve` with the soak's doubles), so it
 * can be killed with SIGKILL like a crashed node and its memory read from /proc alone. Logs at `warn` go to a file.
 */
export class ServerProcess {
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  private constructor(
    private readonly child: ChildProcess,
    readonly address: string,
    readonly startedAt: number,
  ) {
    this.exited = new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve({ code: child.exitCode, signal: child.signalCode });
      else child.once('exit', (code, signal) => resolve({ code, signal }));
    });
  }

  static async start(o: ServerProcessOptions): Promise<ServerProcess> {
    const started = performance.now();
    const args = ['--expose-gc', ...NODE_FLAGS, '--import', 'tsx', SERVER_SCRIPT, '--config', o.configPath, '--run-tag', o.runTag, ...(o.journalDir !== undefined ? ['--journal-dir', o.journalDir] : [])];
    const child = spawn(process.execPath, args, {
      cwd: REPO_ROOT,
      // stdin is a pipe the server watches: it shuts down when the bench goes away (see server.ts).
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, ROLLOUT_LOG_LEVEL: process.env.ROLLOUT_LOG_LEVEL ?? 'warn' },
    });
    const log: WriteStream = createWriteStream(o.logPath, { flags: 'a' });
    child.stderr!.pipe(log, { end: false });
    const address = await new Promise<string>((resolve, reject) => {
      let buffered = '';
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new Error(`soak server did not start within ${o.startTimeoutMs ?? 60_000} ms (log: ${o.logPath})`));
      }, o.startTimeoutMs ?? 60_000);
      const onData = (chunk: Buffer): void => {
        log.write(chunk);
        buffered += chunk.toString('utf8');
        const match = /rollout server listening on (\S+)/.exec(buffered);
        if (!match) return;
        clearTimeout(timer);
        child.stdout!.off('data', onData);
        child.stdout!.pipe(log, { end: false });
        resolve(match[1]!);
      };
      child.stdout!.on('data', onData);
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`soak server exited before it listened (code ${code}, signal ${signal}; log: ${o.logPath})`));
      });
    });
    child.once('exit', () => log.end());
    const server = new ServerProcess(child, address, started);
    return server;
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** kill -9: the crash the journal must survive. Resolves once the process is gone. */
  async kill9(): Promise<void> {
    this.child.kill('SIGKILL');
    await this.exited;
  }

  /**
   * SIGTERM (`rollout serve`'s clean shutdown), then waits for the process to end by itself; past `graceMs` it is
   * killed. Returns how long it took and whether it had to be killed (a handle left open keeps a process alive).
   */
  async terminate(graceMs: number): Promise<{ exitMs: number; forced: boolean; code: number | null; signal: string | null }> {
    const started = performance.now();
    let forced = false;
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => {
      forced = true;
      this.child.kill('SIGKILL');
    }, graceMs);
    const { code, signal } = await this.exited;
    clearTimeout(timer);
    return { exitMs: performance.now() - started, forced, code, signal };
  }
}
