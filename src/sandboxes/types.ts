/** Limits every sandbox has. */
export interface SandboxLimits {
  /** Network access; off unless a task asks. */
  network: boolean;
  /** Address-space limit per process, MiB. */
  memoryMb: number;
  /** Max processes/threads (RLIMIT_NPROC) inside the sandbox. */
  maxProcesses: number;
  /** Wall-clock budget of the whole sandbox, ms; exec calls beyond it fail. */
  wallClockMs: number;
  /** Bytes kept of each of stdout/stderr per exec; the rest is dropped and `truncated` is set. */
  outputLimitBytes: number;
  /** Largest file a sandbox process may write, MiB (RLIMIT_FSIZE); default 256. Per file, not a disk quota. */
  maxFileMb?: number;
}

export interface ExecOptions {
  stdin?: string;
  /** Per-call timeout, ms (bounded by what is left of the sandbox's wall clock). */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Working directory inside the sandbox; default is the sandbox's work dir. */
  cwd?: string;
  env?: Record<string, string>;
}

export interface ExecResult {
  /** null when killed by a signal. */
  exitCode: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  truncated: boolean;
  durationMs: number;
}

/** A running sandbox. `stop()` kills everything in it as a whole process tree and removes its files; idempotent. */
export interface Sandbox {
  readonly id: string;
  /** Absolute path of the work dir as seen inside the sandbox. */
  readonly workdir: string;
  exec(argv: readonly string[], options?: ExecOptions): Promise<ExecResult>;
  writeFile(path: string, content: string): Promise<void>;
  readFile(path: string): Promise<string>;
  stop(): Promise<void>;
}

/**
 * Starts sandboxes. Implementations: bubblewrap (rootless, default). Apptainer/Singularity and Slurm placement
 * are later drivers of this same interface.
 */
export interface SandboxDriver {
  readonly name: string;
  /** Throws RolloutError('sandbox_error') when the driver cannot work on this machine. */
  start(limits: SandboxLimits, signal?: AbortSignal): Promise<Sandbox>;
}
