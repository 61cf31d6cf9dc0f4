import { spawn as spawnChild, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, isAbsolute, join } from 'node:path';
import { RolloutError, throwIfAborted } from '../errors.js';
import { BashShell } from '../sandboxes/bash-shell.js';
import { CappedOutput } from '../sandboxes/capped-output.js';
import type { DirEntry, ExecOptions, ExecResult, PersistentShell, Sandbox, SandboxProcess, SandboxSpec, SpawnOptions } from '../sandboxes/types.js';

const MAX_READ_BYTES = 16 * 1024 * 1024;

/**
 * TEST DOUBLE — NO ISOLATION. A Sandbox whose `spawn` and `exec` run plain host processes (as the server's own
 * user, with the host's file system and network) in a fresh temp dir, which is also its `workdir` (the spec's
 * workdir is ignored: paths inside this "sandbox" are host paths). File operations are plain host file
 * operations. Each process is the leader of its own process group, and `kill()` SIGKILLs that group.
 *
 * Why: tool logic (the persistent shell's framing, the file tools) must be testable on any machine, fast, and
 * independent of the sandbox drivers being built; the same suites then run against the real drivers (see
 * test/sandboxes/shell-conformance.ts). Never use it for anything but tests of code that is not about isolation.
 *
 * @example
 * const sandbox = await HostProcessSandbox.create(testSpec());
 * try { await sandbox.shell().run('echo hi'); } finally { await sandbox.stop(); }
 */
export class HostProcessSandbox implements Sandbox {
  readonly id = `host-${randomUUID().slice(0, 8)}`;
  private readonly children = new Set<ChildProcess>();
  private readonly deadline: number;
  private persistentShell: BashShell | undefined;
  private stopped = false;

  private constructor(
    readonly spec: SandboxSpec,
    readonly workdir: string,
  ) {
    this.deadline = performance.now() + spec.limits.wallClockMs;
  }

  static async create(spec: SandboxSpec): Promise<HostProcessSandbox> {
    return new HostProcessSandbox(spec, await mkdtemp(join(tmpdir(), 'rollout-host-sandbox-')));
  }

  /** Milliseconds left of the wall-clock budget. */
  get remainingMs(): number {
    return Math.max(0, Math.floor(this.deadline - performance.now()));
  }

  spawn(argv: readonly string[], options: SpawnOptions = {}): SandboxProcess {
    this.check();
    const child = spawnChild(argv[0]!, argv.slice(1), {
      cwd: options.cwd ?? this.workdir,
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: this.workdir, LANG: 'C.UTF-8', ...this.spec.env, ...options.env },
      detached: true,
      stdio: 'pipe',
    });
    this.children.add(child);
    const kill = (): void => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    };
    const exited = new Promise<{ exitCode: number | null; signal: string | null }>((resolve) => {
      child.once('error', () => resolve({ exitCode: 127, signal: null }));
      child.once('exit', (exitCode, signal) => resolve({ exitCode, signal }));
    }).finally(() => {
      this.children.delete(child);
      options.signal?.removeEventListener('abort', kill);
    });
    options.signal?.addEventListener('abort', kill, { once: true });
    return { stdin: child.stdin, stdout: child.stdout, stderr: child.stderr, exited, kill };
  }

  async exec(argv: readonly string[], options: ExecOptions = {}): Promise<ExecResult> {
    throwIfAborted(options.signal);
    const started = performance.now();
    const timeoutMs = Math.min(options.timeoutMs ?? this.spec.limits.commandTimeoutMs, this.remainingMs);
    if (timeoutMs <= 0) throw new RolloutError('deadline_exceeded', `sandbox ${this.id} used up its wall clock`);
    const proc = this.spawn(argv, { ...(options.cwd !== undefined && { cwd: options.cwd }), ...(options.env && { env: options.env }) });
    const stdout = new CappedOutput(this.spec.limits.outputLimitBytes);
    const stderr = new CappedOutput(this.spec.limits.outputLimitBytes);
    proc.stdout.on('data', (c: Buffer) => stdout.push(c));
    proc.stderr.on('data', (c: Buffer) => stderr.push(c));
    proc.stdin.on('error', () => undefined);
    proc.stdin.end(options.stdin ?? '');
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      proc.kill();
    }, timeoutMs);
    const onAbort = (): void => proc.kill();
    options.signal?.addEventListener('abort', onAbort, { once: true });
    const closed = Promise.all([new Promise((r) => proc.stdout.once('close', r)), new Promise((r) => proc.stderr.once('close', r))]);
    const { exitCode, signal } = await proc.exited;
    proc.kill(); // what it left behind in its group
    await closed;
    clearTimeout(timer);
    options.signal?.removeEventListener('abort', onAbort);
    throwIfAborted(options.signal);
    return {
      exitCode: timedOut ? null : exitCode,
      signal: timedOut ? 'SIGKILL' : signal,
      stdout: stdout.text(),
      stderr: stderr.text(),
      timedOut,
      truncated: stdout.truncated || stderr.truncated,
      durationMs: performance.now() - started,
    };
  }

  shell(): PersistentShell {
    this.check();
    return (this.persistentShell ??= new BashShell(this, {
      outputLimitBytes: this.spec.limits.outputLimitBytes,
      defaultTimeoutMs: this.spec.limits.commandTimeoutMs,
      remainingMs: () => this.remainingMs,
    }));
  }

  async readFile(path: string, options: { maxBytes?: number } = {}): Promise<string> {
    this.check();
    const full = this.resolve(path);
    const st = await stat(full).catch((err: unknown) => {
      throw fileError(path, err);
    });
    if (!st.isFile()) throw RolloutError.invalid('path', `${path} is ${st.isDirectory() ? 'a directory' : 'not a regular file'}`);
    const max = options.maxBytes ?? MAX_READ_BYTES;
    if (st.size > max) throw RolloutError.invalid('path', `${path} is ${st.size} bytes, over the ${max}-byte limit`);
    return readFile(full, 'utf8');
  }

  async writeFile(path: string, content: string): Promise<void> {
    this.check();
    const full = this.resolve(path);
    try {
      await mkdir(dirname(full), { recursive: true });
      await writeFile(full, content);
    } catch (err) {
      throw fileError(path, err);
    }
  }

  async listDir(path: string): Promise<DirEntry[]> {
    this.check();
    const full = this.resolve(path);
    try {
      const entries = await readdir(full, { withFileTypes: true });
      const out: DirEntry[] = [];
      for (const e of entries) {
        const type = e.isFile() ? 'file' : e.isDirectory() ? 'dir' : e.isSymbolicLink() ? 'symlink' : 'other';
        const size = type === 'file' ? (await stat(join(full, e.name)).catch(() => ({ size: 0 }))).size : 0;
        out.push({ name: e.name, type, size });
      }
      return out.sort((a, b) => (a.name < b.name ? -1 : 1));
    } catch (err) {
      throw fileError(path, err);
    }
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    await this.persistentShell?.close();
    for (const child of this.children) {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    await rm(this.workdir, { recursive: true, force: true });
  }

  private resolve(path: string): string {
    if (path.includes('\0')) throw RolloutError.invalid('path', 'contains a NUL byte');
    return isAbsolute(path) ? path : join(this.workdir, path);
  }

  private check(): void {
    if (this.stopped) throw new RolloutError('sandbox_error', `sandbox ${this.id} is stopped`);
  }
}

function fileError(path: string, err: unknown): RolloutError {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return new RolloutError('not_found', `no such file: ${path}`, { cause: err });
  if (code === 'EISDIR') return RolloutError.invalid('path', `${path} is a directory`);
  if (code === 'ENOTDIR') return RolloutError.invalid('path', `${path}: a parent is not a directory`);
  return RolloutError.from(err, 'sandbox_error');
}
