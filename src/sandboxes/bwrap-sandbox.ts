import { randomUUID } from 'node:crypto';
import { stat } from 'node:fs/promises';
import { constants } from 'node:os';
import { RolloutError, throwIfAborted } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import { buildExecArgs, resolveCwd, type ExecCommandSpec } from './bwrap-command.js';
import { spawnContained, type ContainedProcess } from './contained-process.js';
import { removeTree } from './remove-tree.js';
import type { DirEntry, ExecOptions, ExecResult, PersistentShell, Sandbox, SandboxProcess, SandboxSpec } from './types.js';
import { WorkDir } from './work-dir.js';

/** What every exec of the sandbox shares: the exec command spec less the per-call parts. */
export interface BubblewrapSandboxInit extends Omit<ExecCommandSpec, 'cwd' | 'env' | 'argv'> {
  spec: SandboxSpec;
  logger: Logger;
  onStopped: () => void;
}

/**
 * bwrap's init reports a program killed by signal N as exit code 128 + N (the shell convention); we turn it back
 * into the signal, which is what ExecResult promises. A program that really exits 128 + N reads the same way.
 */
function signalOfExitCode(code: number | null): string | null {
  if (code === null || code <= 128) return null;
  const n = code - 128;
  return Object.entries(constants.signals).find(([, num]) => num === n)?.[0] ?? null;
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
/** How long stop() waits for killed execs to be reaped before removing the work dir anyway. */
const REAP_WAIT_MS = 5_000;

/**
 * One bubblewrap sandbox: a host work dir plus limits; every `exec` is a fresh bwrap (see BubblewrapDriver).
 * Created by `BubblewrapDriver.start`. Invariants: after `stop()` resolves, no process of this sandbox is alive
 * and its work dir is gone; `exec`/`readFile`/`writeFile` then fail with `sandbox_error`.
 */
export class BubblewrapSandbox implements Sandbox {
  readonly id = `bwrap-${randomUUID().slice(0, 8)}`;
  readonly spec: SandboxSpec;
  readonly workdir: string;
  /** The work dir on the host (for diagnostics and tests; it disappears on stop). */
  readonly hostWorkdir: string;
  private readonly files: WorkDir;
  private readonly deadline: number;
  private readonly running = new Set<ContainedProcess>();
  private readonly log: Logger;
  private stopping: Promise<void> | undefined;

  constructor(private readonly init: BubblewrapSandboxInit) {
    this.spec = init.spec;
    this.workdir = init.workdir;
    this.hostWorkdir = init.hostWorkdir;
    this.files = new WorkDir(init.hostWorkdir, init.workdir, init.identity.kind === 'setuid' ? init.identity : undefined);
    this.deadline = performance.now() + init.limits.wallClockMs;
    this.log = init.logger.child({ sandbox: this.id });
  }

  /** Milliseconds left of the wall-clock budget (never negative). */
  get remainingMs(): number {
    return Math.max(0, Math.floor(this.deadline - performance.now()));
  }

  async exec(argv: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    this.assertLive();
    if (argv.length === 0 || argv.some((a) => typeof a !== 'string' || a.includes('\0'))) throw RolloutError.invalid('argv', 'must be non-empty strings without NUL');
    throwIfAborted(options.signal);
    const remaining = this.remainingMs;
    if (remaining <= 0) throw new RolloutError('deadline_exceeded', `sandbox ${this.id} used up its ${this.init.limits.wallClockMs} ms wall-clock budget`);
    const timeoutMs = Math.min(options.timeoutMs ?? this.init.limits.commandTimeoutMs, remaining);
    const cwd = resolveCwd(this.workdir, options.cwd);
    await this.checkCwd(cwd, options.cwd);
    const env = { ...this.spec.env, ...options.env };
    for (const key of Object.keys(env)) if (!ENV_NAME.test(key)) throw RolloutError.invalid('env', `bad variable name ${JSON.stringify(key)}`);

    this.assertLive(); // stop() may have begun while we checked the cwd

    const args = buildExecArgs({ ...this.init, cwd, env, argv });
    const proc = spawnContained(this.init.bwrapPath, args, {
      timeoutMs,
      outputLimitBytes: this.init.limits.outputLimitBytes,
      ...(options.stdin !== undefined && { stdin: options.stdin }),
      ...(options.signal !== undefined && { signal: options.signal }),
    });
    this.running.add(proc);
    const r = await proc.result.finally(() => this.running.delete(proc));
    this.log.debug({ argv0: argv[0], exitCode: r.exitCode, timedOut: r.timedOut, droppedBytes: r.droppedBytes, ms: r.durationMs }, 'exec');

    if (r.spawnError) throw new RolloutError('sandbox_error', `cannot run ${this.init.bwrapPath}: ${r.spawnError.message}`, { cause: r.spawnError });
    if (r.aborted) throw RolloutError.from(options.signal?.reason, 'cancelled');
    if (r.killed) throw new RolloutError('sandbox_error', `sandbox ${this.id} was stopped while running ${argv[0]}`);
    if (!r.started && !r.timedOut) {
      throw new RolloutError('sandbox_error', `bwrap failed to start (exit code ${r.exitCode ?? r.signal}): ${r.stderr.trim()}`);
    }
    const killedBy = r.timedOut ? 'SIGKILL' : signalOfExitCode(r.exitCode);
    return {
      exitCode: killedBy ? null : r.exitCode,
      signal: killedBy ?? r.signal,
      stdout: r.stdout,
      stderr: r.stderr,
      timedOut: r.timedOut,
      truncated: r.truncated,
      durationMs: r.durationMs,
    };
  }

  spawn(): SandboxProcess {
    this.assertLive();
    throw new RolloutError('sandbox_error', 'long-lived processes need the long-lived bubblewrap sandbox (not built yet)');
  }

  shell(): PersistentShell {
    this.assertLive();
    throw new RolloutError('sandbox_error', 'the persistent shell needs the long-lived bubblewrap sandbox (not built yet)');
  }

  async listDir(path: string): Promise<DirEntry[]> {
    this.assertLive();
    return this.files.list(path);
  }

  async writeFile(path: string, content: string): Promise<void> {
    this.assertLive();
    await this.files.write(path, content);
  }

  async readFile(path: string): Promise<string> {
    this.assertLive();
    return this.files.read(path);
  }

  stop(): Promise<void> {
    this.stopping ??= this.doStop();
    return this.stopping;
  }

  private async doStop(): Promise<void> {
    const procs = [...this.running];
    for (const proc of procs) proc.kill();
    let timer: NodeJS.Timeout | undefined;
    const reaped = await Promise.race([
      Promise.all(procs.map((p) => p.result)).then(() => true),
      new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), REAP_WAIT_MS))),
    ]);
    clearTimeout(timer);
    if (!reaped) this.log.error({ pending: this.running.size }, 'killed execs were not reaped in time');
    try {
      await removeTree(this.hostWorkdir);
    } catch (err) {
      this.log.error({ err, hostWorkdir: this.hostWorkdir }, 'removing the work dir failed');
    }
    this.init.onStopped();
    this.log.debug({ killed: procs.length }, 'sandbox stopped');
  }

  private assertLive(): void {
    if (this.stopping) throw new RolloutError('sandbox_error', `sandbox ${this.id} is stopped`);
  }

  /** A cwd inside the work dir must exist, or bwrap's chdir would fail and look like a sandbox failure. */
  private async checkCwd(cwd: string, given: string | undefined): Promise<void> {
    if (given === undefined || cwd === this.workdir) return;
    if (!cwd.startsWith(`${this.workdir}/`)) return;
    const host = this.files.hostPath(cwd);
    const st = await stat(host).catch(() => undefined);
    if (!st?.isDirectory()) throw RolloutError.invalid('cwd', `${given} is not a directory`);
  }
}
