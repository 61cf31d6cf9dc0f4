import { spawn as spawnChild } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import type { Readable, Writable } from 'node:stream';
import { RolloutError, throwIfAborted } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import { buildExecArgv, defaultEnv, resolveInSandbox, STARTED_FD, type SandboxIdentity } from './bwrap-command.js';
import { LAUNCH_ENV, namespaceFdNumbers, type Holder } from './bwrap-holder.js';
import type { FdCloser } from './fd-closer.js';
import { SANDBOX_INIT_PATH } from './init/sandbox-init.js';
import type { SandboxCgroup } from './cgroups.js';
import { spawnContained, type ContainedRunResult } from './contained-process.js';
import type { HostPython } from './host-python.js';
import type { SlirpNetwork } from './slirp-network.js';
import { exhaustedLimit } from './limit-errors.js';
import { SandboxFiles, type RunInside } from './sandbox-files.js';
import { BashShell } from './bash-shell.js';
import type {
  DirEntry, ExecOptions, ExecResult, FileOptions, PersistentShell, Sandbox, SandboxProcess, SandboxSpec, SpawnOptions,
} from './types.js';

export interface BubblewrapSandboxInit {
  id: string;
  spec: SandboxSpec;
  holder: Holder;
  cgroup: SandboxCgroup;
  /** Whether limits hold through cgroups (else per-process rlimits are added to each command). */
  cgroups: boolean;
  identity: SandboxIdentity;
  python: HostPython | undefined;
  /** The host's descriptor closer (fd-closer.ts): every launch chain starts with it. */
  closer: FdCloser;
  /** Whether the sandbox init is bound at SANDBOX_INIT_PATH (then it closes descriptors inside the sandbox too). */
  hasInit: boolean;
  logger: Logger;
  /** The slirp4netns process of an isolated network (`network: true`), killed with the sandbox. */
  network?: Pick<SlirpNetwork, 'kill' | 'exited'>;
  /** Gives back what start() took (image, uid); called once, after every process is gone. */
  onStopped: () => Promise<void>;
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
/** How long stop() waits for bwrap's monitor to exit after the kill. */
const EXIT_WAIT_MS = 5_000;

interface Running {
  kill(): void;
  readonly done: Promise<unknown>;
}

/**
 * One long-lived bubblewrap sandbox (see BubblewrapDriver): a holder process tree in its own namespaces, which
 * every command, spawned process and file operation enters through nsenter. Invariants: after `stop()` resolves no
 * process of the sandbox is alive, its cgroups are gone and its image is released; every call then fails with
 * sandbox_error — or deadline_exceeded when the sandbox's wall clock ran out, which stops it by itself.
 */
export class BubblewrapSandbox implements Sandbox {
  readonly id: string;
  readonly spec: SandboxSpec;
  readonly workdir: string;
  #shell: BashShell | undefined;
  private readonly files: SandboxFiles;
  private readonly deadline: number;
  private readonly deadlineTimer: NodeJS.Timeout;
  private readonly running = new Set<Running>();
  private readonly log: Logger;
  private readonly baseEnv: Record<string, string>;
  private stopping: Promise<void> | undefined;
  private expired = false;
  /** Why the holder died on its own (read from the cgroups when it did, before stop() removes them). */
  private death: RolloutError | undefined;

  constructor(private readonly init: BubblewrapSandboxInit) {
    this.id = init.id;
    this.spec = init.spec;
    this.workdir = init.spec.workdir;
    this.log = init.logger.child({ sandbox: this.id });
    this.baseEnv = { ...defaultEnv(init.python, this.workdir), ...init.spec.env };
    this.deadline = performance.now() + init.spec.limits.wallClockMs;
    this.deadlineTimer = setTimeout(() => {
      this.expired = true;
      this.log.info({ wallClockMs: init.spec.limits.wallClockMs }, 'sandbox reached its wall-clock deadline: stopping it');
      void this.stop();
    }, init.spec.limits.wallClockMs);
    this.deadlineTimer.unref();
    // The init's --read-file opens without blocking whatever tools the image has (busybox has no dd iflag=nonblock).
    this.files = new SandboxFiles(this.workdir, this.runInside, init.hasInit ? SANDBOX_INIT_PATH : undefined);
    void init.holder.exited.then(() => {
      if (this.stopping) return;
      const death = this.deathError();
      this.log.warn({ reason: death.message }, 'the sandbox died on its own (its holder exited)');
    });
  }

  /** Milliseconds left of the wall-clock budget (never negative). */
  get remainingMs(): number {
    return Math.max(0, Math.floor(this.deadline - performance.now()));
  }

  /** Highest memory use of the whole sandbox so far (its cgroup's), bytes; undefined without cgroups. */
  peakMemoryBytes(): Promise<number | undefined> {
    return this.init.cgroup.peakMemoryBytes().catch(() => undefined);
  }

  async exec(argv: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    const r = await this.execRaw(argv, { ...options, outputLimitBytes: this.spec.limits.outputLimitBytes });
    return {
      exitCode: r.timedOut ? null : r.exitCode,
      signal: r.timedOut ? 'SIGKILL' : r.signal,
      stdout: r.stdout,
      stderr: r.stderr,
      timedOut: r.timedOut,
      truncated: r.truncated,
      ...(r.outputHeld && { outputHeld: true }),
      durationMs: r.durationMs,
    };
  }

  spawn(argv: readonly string[], options: SpawnOptions = {}): SandboxProcess {
    this.assertLive();
    validateArgv(argv);
    throwIfAborted(options.signal);
    const cmd = this.init.cgroup.command();
    // fd 3 (the started pipe) is not given to a spawned process: only the namespaces are kept for nsenter.
    const args = this.commandArgv(argv, cmd.procs, options, false);
    const child = spawnChild(args[0]!, args.slice(1), {
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe', 'ignore', ...this.init.holder.namespaces.fds],
      env: LAUNCH_ENV,
    });
    const kill = (): void => {
      void cmd.kill();
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {
        // Already gone.
      }
    };
    const onAbort = (): void => kill();
    options.signal?.addEventListener('abort', onAbort, { once: true });
    const stdin = child.stdin as Writable;
    stdin.on('error', () => undefined);
    // `exited` is the process's exit ('exit'), not the end of its pipes ('close'), which a background job it started
    // may hold open for good: a persistent shell that ran `sleep 1000 & exit 3` must be seen to have ended.
    const exited = new Promise<{ exitCode: number | null; signal: string | null }>((resolve) => {
      child.once('error', () => resolve({ exitCode: null, signal: null }));
      child.once('exit', (exitCode, signal) => resolve({ exitCode, signal }));
    });
    const closed = new Promise<void>((resolve) => {
      child.once('error', () => resolve());
      child.once('close', () => resolve());
    }).then(async () => {
      options.signal?.removeEventListener('abort', onAbort);
      await cmd.release();
    });
    const entry: Running = { kill, done: closed };
    this.running.add(entry);
    void closed.finally(() => this.running.delete(entry));
    return { stdin, stdout: child.stdout as Readable, stderr: child.stderr as Readable, exited, kill };
  }

  shell(): PersistentShell {
    this.assertLive();
    this.#shell ??= BashShell.forSandbox(this, (detail) => this.launchFailure(null, detail));
    return this.#shell;
  }

  async readFile(path: string, options: FileOptions & { maxBytes?: number } = {}): Promise<string> {
    this.assertLive();
    return this.files.read(path, options);
  }

  async writeFile(path: string, content: string, options: FileOptions = {}): Promise<void> {
    this.assertLive();
    return this.files.write(path, content, options);
  }

  async listDir(path: string, options: FileOptions = {}): Promise<DirEntry[]> {
    this.assertLive();
    return this.files.list(path, options);
  }

  stop(): Promise<void> {
    this.stopping ??= this.doStop();
    return this.stopping;
  }

  private async doStop(): Promise<void> {
    // The shell is a process of the sandbox like any other: killed below with the whole tree; close() only
    // settles its pending commands.
    void this.#shell?.close();
    clearTimeout(this.deadlineTimer);
    const running = [...this.running];
    for (const r of running) r.kill();
    this.init.holder.kill();
    this.init.network?.kill();
    await this.init.cgroup.remove().catch((err: unknown) => this.log.error({ err }, 'removing the cgroups failed'));
    let timer: NodeJS.Timeout | undefined;
    const exited = await Promise.race([
      Promise.all([this.init.holder.exited, ...(this.init.network ? [this.init.network.exited] : []), ...running.map((r) => r.done)]).then(() => true),
      new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), EXIT_WAIT_MS))),
    ]);
    clearTimeout(timer);
    if (!exited) this.log.error('the sandbox processes were not reaped in time');
    await this.init.onStopped().catch((err: unknown) => this.log.error({ err }, 'releasing the sandbox failed'));
    this.log.debug({ killed: running.length }, 'sandbox stopped');
  }

  private assertLive(): void {
    if (this.expired) throw new RolloutError('deadline_exceeded', `sandbox ${this.id} used up its ${this.spec.limits.wallClockMs} ms wall-clock budget`);
    if (this.stopping) throw new RolloutError('sandbox_error', `sandbox ${this.id} is stopped`);
    if (!this.init.holder.alive) throw this.deathError();
  }

  /**
   * Why the holder died: the sandbox's own memory limit (a policy outcome, SandboxLimitError) or something else
   * (sandbox_error). Decided once, from the cgroups as they were when it died.
   */
  private deathError(): RolloutError {
    this.death ??= exhaustedLimit(this.init.cgroup.usage(), { kind: 'died' }, this.spec.limits) ?? new RolloutError('sandbox_error', `sandbox ${this.id} died`);
    return this.death;
  }

  /**
   * Why a launcher could not enter the sandbox: the sandbox at its own process or memory limit (SandboxLimitError,
   * the policy's doing), its holder dead, or else an infrastructure failure (undefined: the caller says which).
   */
  private launchFailure(signal: string | null, detail: string): RolloutError | undefined {
    if (!this.init.holder.alive && !this.stopping) return this.deathError();
    return exhaustedLimit(this.init.cgroup.usage(), { kind: 'launch', signal, detail }, this.spec.limits);
  }

  /**
   * File operations' commands. One killed by a signal is checked against the sandbox's own limits first: the OOM
   * killer of a sandbox the model filled took it (SandboxLimitError, the policy's outcome); otherwise SandboxFiles
   * reports it as sandbox_error.
   */
  private readonly runInside: RunInside = async (argv, options) => {
    const r = await this.execRaw(argv, options);
    if (r.exitCode === null && !r.timedOut) {
      const limit = this.launchFailure(r.signal, r.stderr);
      if (limit) throw limit;
    }
    return r;
  };

  private async execRaw(
    argv: readonly string[],
    options: ExecOptions & { outputLimitBytes: number },
  ): Promise<ContainedRunResult> {
    this.assertLive();
    validateArgv(argv);
    throwIfAborted(options.signal);
    const remaining = this.remainingMs;
    if (remaining <= 0) throw new RolloutError('deadline_exceeded', `sandbox ${this.id} used up its ${this.spec.limits.wallClockMs} ms wall-clock budget`);
    const timeoutMs = Math.min(options.timeoutMs ?? this.spec.limits.commandTimeoutMs, remaining);
    const cmd = this.init.cgroup.command();
    const args = this.commandArgv(argv, cmd.procs, options);
    const proc = spawnContained(args[0]!, args.slice(1), {
      timeoutMs,
      outputLimitBytes: options.outputLimitBytes,
      fds: this.init.holder.namespaces.fds,
      killTree: () => void cmd.kill(),
      ...(options.stdin !== undefined && { stdin: options.stdin }),
      ...(options.signal !== undefined && { signal: options.signal }),
    });
    const entry: Running = { kill: () => proc.kill(), done: proc.result };
    this.running.add(entry);
    const r = await proc.result.finally(() => this.running.delete(entry));
    // Leftovers (background, setsid()ed) of a command live on unless it timed out, was aborted or the caller
    // asked (graders: one test's leftovers must not take the next test's processes or memory).
    if (r.timedOut || r.aborted || r.killed || options.killLeftovers === true) await cmd.kill();
    await cmd.release();
    this.log.debug({ argv0: argv[0], exitCode: r.exitCode, timedOut: r.timedOut, droppedBytes: r.droppedBytes, ms: r.durationMs }, 'exec');

    if (r.spawnError) throw new RolloutError('sandbox_error', `cannot launch a command: ${r.spawnError.message}`, { cause: r.spawnError });
    if (r.aborted) throw RolloutError.from(options.signal?.reason, 'cancelled');
    if (r.killed && this.expired) return { ...r, timedOut: true };
    if (r.killed) throw new RolloutError('sandbox_error', `sandbox ${this.id} was stopped while running ${argv[0]}`);
    // Named as resolved: an unset or empty cwd is the workspace, which the model can make unenterable (chmod 000).
    if (r.startByte === 'c') throw RolloutError.invalid('cwd', `${this.resolveCwd(options.cwd)} is not a directory or cannot be entered`);
    if (r.startByte !== '1' && !r.timedOut) {
      throw this.launchFailure(r.signal, r.stderr) ??
        new RolloutError('sandbox_error', `could not enter sandbox ${this.id} (exit ${r.exitCode ?? r.signal}): ${r.stderr.trim()}`);
    }
    return r;
  }

  /** The directory a command runs in: the workspace unless `cwd` names one (relative to the workspace). */
  private resolveCwd(cwd: string | undefined): string {
    return cwd === undefined || cwd === '' ? this.workdir : resolveInSandbox(this.workdir, cwd);
  }

  /** The host argv of a command: the host's descriptor closer (keeping the started pipe and the namespaces), then the chain. */
  private commandArgv(argv: readonly string[], cgroupProcs: readonly string[], options: { cwd?: string; env?: Readonly<Record<string, string>> }, started = true): string[] {
    const env = { ...this.baseEnv, ...options.env };
    for (const [key, value] of Object.entries(env)) {
      if (!ENV_NAME.test(key)) throw RolloutError.invalid('env', `bad variable name ${JSON.stringify(key)}`);
      if (typeof value !== 'string' || value.includes('\0')) throw RolloutError.invalid('env', `${key} must be a string without NUL`);
    }
    const cwd = this.resolveCwd(options.cwd);
    if (cwd.includes('\0')) throw RolloutError.invalid('cwd', 'contains a NUL byte');
    const nsFds = namespaceFdNumbers(this.init.holder.namespaces);
    const chain = buildExecArgv({
      limits: this.spec.limits,
      nsFds,
      cgroups: this.init.cgroups,
      cgroupProcs,
      cwd,
      env,
      argv,
      ...(this.init.hasInit && { closer: SANDBOX_INIT_PATH }),
    });
    return this.init.closer.wrap([...(started ? [STARTED_FD] : []), ...Object.values(nsFds)], chain);
  }
}

function validateArgv(argv: readonly string[]): void {
  if (argv.length === 0 || argv.some((a) => typeof a !== 'string' || a.includes('\0'))) throw RolloutError.invalid('argv', 'must be non-empty strings without NUL');
}

/** A fresh sandbox id: short, unique, safe as a cgroup name. */
export function newSandboxId(): string {
  return `bwrap-${randomUUID().slice(0, 12)}`;
}
