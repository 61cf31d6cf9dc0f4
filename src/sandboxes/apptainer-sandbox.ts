import { BashShell } from './bash-shell.js';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { constants } from 'node:os';
import { posix } from 'node:path';
import { RolloutError, throwIfAborted } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import { CWD_EXIT_CODE, CWD_MARKER, execArgs, killTaggedArgs, type WrapperLimits } from './apptainer-command.js';
import { fileScriptError, LIST_DIR_SCRIPT, READ_FILE_SCRIPT, WRITE_FILE_SCRIPT } from './apptainer-files.js';
import { MAX_LIST_BYTES, parseDirListing } from './sandbox-files.js';
import { spawnContained, type ContainedProcess, type ContainedRunResult } from './contained-process.js';
import type { FdCloser } from './fd-closer.js';
import type { DirEntry, ExecOptions, ExecResult, FileOptions, PersistentShell, Sandbox, SandboxProcess, SandboxSpec, SpawnOptions } from './types.js';

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const DEFAULT_MAX_READ = 16 << 20;
/** Budget of the small housekeeping execs (file operations get the command timeout). */
const CLEANUP_TIMEOUT_MS = 10_000;

/** What the driver hands a sandbox it started. */
export interface ApptainerSandboxInit {
  spec: SandboxSpec;
  binary: string;
  hostEnv: Readonly<Record<string, string>>;
  name: string;
  rlimits: WrapperLimits;
  /** The host's descriptor closer (fd-closer.ts): every exec starts with it, keeping only stdin, stdout and stderr. */
  closer: FdCloser;
  logger: Logger;
  /** Stops the instance and removes the host dir; called once, by `stop()` or the wall clock. */
  teardown: () => Promise<void>;
}

/**
 * One Apptainer instance (see ApptainerDriver). Every exec, spawn and file operation is an
 * `apptainer exec instance://NAME` through the wrapper of apptainer-command.ts; each is the leader of its own host
 * process group, killed as a group on timeout, abort or stop, followed by an in-instance kill of what it tagged.
 *
 * Invariants: after `stop()` resolves the instance is stopped (its PID namespace, hence every process in it, is
 * gone) and the host dir removed; past the wall clock the instance is stopped and calls fail with
 * deadline_exceeded; after `stop()` they fail with sandbox_error.
 */
export class ApptainerSandbox implements Sandbox {
  readonly id: string;
  readonly spec: SandboxSpec;
  readonly workdir: string;
  private readonly log: Logger;
  private readonly deadline: number;
  private readonly running = new Set<ContainedProcess | SpawnedProcess>();
  private readonly wallTimer: NodeJS.Timeout;
  private stopping: Promise<void> | undefined;
  #shell: BashShell | undefined;
  private expired = false;

  constructor(private readonly init: ApptainerSandboxInit) {
    this.id = init.name;
    this.spec = init.spec;
    this.workdir = init.spec.workdir;
    this.log = init.logger.child({ sandbox: this.id });
    this.deadline = performance.now() + init.spec.limits.wallClockMs;
    this.wallTimer = setTimeout(() => {
      this.expired = true;
      this.log.warn({ wallClockMs: init.spec.limits.wallClockMs }, 'wall clock used up: stopping the instance');
      void this.stop();
    }, init.spec.limits.wallClockMs);
    this.wallTimer.unref();
  }

  get remainingMs(): number {
    return Math.max(0, Math.floor(this.deadline - performance.now()));
  }

  async exec(argv: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    this.assertLive();
    if (argv.length === 0 || argv.some((a) => typeof a !== 'string' || a.includes('\0'))) throw RolloutError.invalid('argv', 'must be non-empty strings without NUL');
    if (argv[0]?.includes('=')) throw RolloutError.invalid('argv', "argv[0] must not contain '='");
    throwIfAborted(options.signal);
    const timeoutMs = Math.min(options.timeoutMs ?? this.spec.limits.commandTimeoutMs, this.remainingMs);
    const cwd = this.resolveCwd(options.cwd);
    const r = await this.run(argv, {
      cwd,
      env: options.env,
      timeoutMs,
      outputLimitBytes: this.spec.limits.outputLimitBytes,
      stdin: options.stdin,
      signal: options.signal,
      killLeftovers: options.killLeftovers === true,
    });
    if (r.exitCode === CWD_EXIT_CODE && r.stdout === '' && r.stderr.startsWith(CWD_MARKER)) {
      // Named as resolved: an empty cwd is the workspace, which the model can make unenterable (chmod 000).
      throw RolloutError.invalid('cwd', `${cwd} is not a directory or cannot be entered`);
    }
    const killedBy = r.timedOut ? 'SIGKILL' : signalOfExitCode(r.exitCode);
    return {
      exitCode: killedBy ? null : r.exitCode,
      signal: killedBy ?? r.signal,
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
    if (argv.length === 0 || argv[0]?.includes('=')) throw RolloutError.invalid('argv', "must be non-empty, argv[0] without '='");
    throwIfAborted(options.signal);
    const tag = newTag();
    const args = execArgs({ name: this.init.name, workdir: this.workdir, cwd: this.resolveCwd(options.cwd), env: this.envFor(options.env), tag, rlimits: this.init.rlimits, argv });
    const [command, ...rest] = this.launch(args);
    const child = spawn(command!, rest, { detached: true, stdio: ['pipe', 'pipe', 'pipe'], env: { ...this.init.hostEnv } });
    child.stdin.on('error', () => undefined);
    const proc: SpawnedProcess = { kill: () => killGroup(child.pid) };
    this.running.add(proc);
    const onAbort = (): void => sandboxProcess.kill();
    // Settles on the process's exit, not on the end of its pipes, which a background job it started may hold open.
    const exited = new Promise<{ exitCode: number | null; signal: string | null }>((resolve) => {
      child.on('error', (err) => {
        this.log.error({ err }, 'spawn failed');
        resolve({ exitCode: null, signal: null });
      });
      child.once('exit', (code, signal) => {
        const killedBy = signal ?? signalOfExitCode(code);
        resolve({ exitCode: killedBy ? null : code, signal: killedBy });
      });
      child.on('close', () => {
        this.running.delete(proc);
        options.signal?.removeEventListener('abort', onAbort);
      });
    });
    let killed = false;
    const sandboxProcess: SandboxProcess = {
      stdin: child.stdin,
      stdout: child.stdout,
      stderr: child.stderr,
      exited,
      kill: () => {
        if (killed) return;
        killed = true;
        killGroup(child.pid);
        void this.killTagged(tag);
      },
    };
    if (options.signal?.aborted) onAbort();
    else options.signal?.addEventListener('abort', onAbort, { once: true });
    return sandboxProcess;
  }

  shell(): PersistentShell {
    this.assertLive();
    this.#shell ??= BashShell.forSandbox(this);
    return this.#shell;
  }

  async readFile(path: string, options: FileOptions & { maxBytes?: number } = {}): Promise<string> {
    this.assertLive();
    const maxBytes = options.maxBytes ?? DEFAULT_MAX_READ;
    const r = await this.fileScript(READ_FILE_SCRIPT, [this.absolute(path), String(maxBytes)], { outputLimitBytes: maxBytes, signal: options.signal });
    // More than maxBytes came (the script reads a little past it): the file is over the limit.
    if (r.truncated && r.exitCode === 0) throw RolloutError.invalid('path', `${path} is over the ${maxBytes}-byte read limit`);
    const err = fileScriptError('readFile', path, fileOutcome(r), maxBytes);
    if (err) throw err;
    return r.stdout;
  }

  async writeFile(path: string, content: string, options: FileOptions = {}): Promise<void> {
    this.assertLive();
    const r = await this.fileScript(WRITE_FILE_SCRIPT, [this.absolute(path)], { stdin: content, outputLimitBytes: 4096, signal: options.signal });
    const err = fileScriptError('writeFile', path, fileOutcome(r));
    if (err) throw err;
  }

  async listDir(path: string, options: FileOptions = {}): Promise<DirEntry[]> {
    this.assertLive();
    const r = await this.fileScript(LIST_DIR_SCRIPT, [this.absolute(path)], { outputLimitBytes: MAX_LIST_BYTES, signal: options.signal });
    const err = r.truncated ? null : fileScriptError('listDir', path, fileOutcome(r));
    if (err) throw err;
    return parseDirListing(r.stdout, path, r.truncated);
  }

  stop(): Promise<void> {
    this.stopping ??= this.doStop();
    return this.stopping;
  }

  private async doStop(): Promise<void> {
    clearTimeout(this.wallTimer);
    await this.#shell?.close();
    const procs = [...this.running];
    for (const p of procs) p.kill();
    await this.init.teardown();
    this.log.debug({ killed: procs.length }, 'sandbox stopped');
  }

  /** Runs one exec through the wrapper; a timeout or abort also kills what it tagged inside the instance. */
  private async run(argv: readonly string[], o: { cwd: string; env: Readonly<Record<string, string>> | undefined; timeoutMs: number; outputLimitBytes: number; stdin: string | undefined; signal: AbortSignal | undefined; killLeftovers?: boolean }): Promise<ContainedRunResult> {
    if (o.timeoutMs <= 0) throw this.wallClockError();
    const tag = newTag();
    const args = execArgs({ name: this.init.name, workdir: this.workdir, cwd: o.cwd, env: this.envFor(o.env), tag, rlimits: this.init.rlimits, argv });
    this.assertLive();
    const [command, ...rest] = this.launch(args);
    const proc = spawnContained(command!, rest, {
      timeoutMs: o.timeoutMs,
      outputLimitBytes: o.outputLimitBytes,
      env: this.init.hostEnv,
      ...(o.stdin !== undefined && { stdin: o.stdin }),
      ...(o.signal !== undefined && { signal: o.signal }),
    });
    this.running.add(proc);
    const r = await proc.result.finally(() => this.running.delete(proc));
    this.log.debug({ argv0: argv[0], exitCode: r.exitCode, timedOut: r.timedOut, droppedBytes: r.droppedBytes, ms: r.durationMs }, 'exec');
    if (r.spawnError) throw new RolloutError('sandbox_error', `cannot run ${this.init.binary}: ${r.spawnError.message}`, { cause: r.spawnError });
    if ((r.timedOut || r.aborted || o.killLeftovers === true) && !r.killed) await this.killTagged(tag);
    if (r.aborted) throw RolloutError.from(o.signal?.reason, 'cancelled');
    if (r.killed || this.stopping) {
      if (this.expired) throw this.wallClockError();
      throw new RolloutError('sandbox_error', `sandbox ${this.id} was stopped while running ${argv[0] ?? ''}`);
    }
    // apptainer's own failures (the instance is gone, the image broke) print FATAL and exit 255.
    if (r.exitCode === 255 && /^FATAL:/m.test(r.stderr) && r.stdout === '') {
      throw new RolloutError('sandbox_error', `apptainer exec failed: ${r.stderr.trim().slice(0, 1000)}`);
    }
    return r;
  }

  private async fileScript(script: string, args: string[], o: { stdin?: string; outputLimitBytes: number; signal: AbortSignal | undefined }): Promise<ContainedRunResult> {
    throwIfAborted(o.signal);
    const r = await this.run(['/bin/sh', '-c', script, 'rollout-file', ...args], {
      cwd: this.workdir,
      env: undefined,
      timeoutMs: Math.min(this.spec.limits.commandTimeoutMs, this.remainingMs),
      outputLimitBytes: o.outputLimitBytes,
      stdin: o.stdin,
      signal: o.signal,
    });
    if (r.timedOut) throw new RolloutError('deadline_exceeded', `file operation in sandbox ${this.id} timed out`);
    return r;
  }

  /** Kills, inside the instance, every process an exec tagged. Best effort: logged, never thrown. */
  private async killTagged(tag: string): Promise<void> {
    if (this.stopping) return; // the instance stop kills everything anyway
    const [command, ...rest] = this.launch(killTaggedArgs(this.init.name, tag));
    const r = await spawnContained(command!, rest, { timeoutMs: CLEANUP_TIMEOUT_MS, outputLimitBytes: 4096, env: this.init.hostEnv }).result;
    if (r.spawnError || r.exitCode !== 0) this.log.warn({ tag, exitCode: r.exitCode, stderr: r.stderr.trim() }, 'in-instance cleanup of an exec failed');
  }

  /**
   * The host argv of an `apptainer exec`: behind the descriptor closer, since apptainer hands the program every
   * descriptor it inherited.
   */
  private launch(args: readonly string[]): string[] {
    return this.init.closer.wrap([], [this.init.binary, ...args]);
  }

  private envFor(extra: Readonly<Record<string, string>> | undefined): Record<string, string> {
    const env = {
      PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
      HOME: this.workdir,
      LANG: 'C.UTF-8',
      ...this.spec.env,
      ...extra,
    };
    for (const key of Object.keys(env)) if (!ENV_NAME.test(key)) throw RolloutError.invalid('env', `bad variable name ${JSON.stringify(key)}`);
    for (const value of Object.values(env)) if (value.includes('\0')) throw RolloutError.invalid('env', 'values must not contain NUL');
    return env;
  }

  private resolveCwd(cwd: string | undefined): string {
    if (cwd === undefined) return this.workdir;
    if (cwd.includes('\0')) throw RolloutError.invalid('cwd', 'contains a NUL byte');
    return this.absolute(cwd);
  }

  private absolute(path: string): string {
    if (path.includes('\0')) throw RolloutError.invalid('path', 'contains a NUL byte');
    return posix.normalize(path.startsWith('/') ? path : posix.join(this.workdir, path));
  }

  private wallClockError(): RolloutError {
    return new RolloutError('deadline_exceeded', `sandbox ${this.id} used up its ${this.spec.limits.wallClockMs} ms wall-clock budget`);
  }

  private assertLive(): void {
    if (this.expired) throw this.wallClockError();
    if (this.stopping) throw new RolloutError('sandbox_error', `sandbox ${this.id} is stopped`);
  }
}

interface SpawnedProcess {
  kill(): void;
}

function newTag(): string {
  return randomBytes(8).toString('hex');
}

function killGroup(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // ESRCH: already gone.
  }
}

/** A file script's outcome for fileScriptError: the signal that killed it, from apptainer's exit code or its own. */
function fileOutcome(r: ContainedRunResult): { exitCode: number | null; killedBy: string | null; stderr: string } {
  return { exitCode: r.exitCode, killedBy: r.signal ?? signalOfExitCode(r.exitCode), stderr: r.stderr };
}

/**
 * apptainer exec reports a program killed by signal N as exit code 128 + N (the shell convention); ExecResult
 * promises the signal. A program that really exits 128 + N reads the same way.
 */
export function signalOfExitCode(code: number | null): string | null {
  if (code === null || code <= 128 || code >= 255) return null;
  const n = code - 128;
  return Object.entries(constants.signals).find(([, num]) => num === n)?.[0] ?? null;
}
