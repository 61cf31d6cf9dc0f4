import type { Readable, Writable } from 'node:stream';

/**
 * Limits of one sandbox. Memory and processes hold for the sandbox as a whole (every process in it, and its
 * tmpfs workspace and /tmp, which live in memory), not per process; see each driver for how (cgroups where the
 * server may create them, a documented fallback where not).
 */
export interface SandboxLimits {
  /** Memory of the whole sandbox, MiB: its processes plus what its tmpfs workspace and /tmp hold. */
  memoryMb: number;
  /** Processes and threads alive at once in the whole sandbox. */
  maxProcesses: number;
  /** Size quota of the writable workspace and of /tmp (each a size-limited tmpfs), MiB. */
  diskMb: number;
  /** Wall-clock life of the sandbox, ms: commands past it fail with deadline_exceeded. */
  wallClockMs: number;
  /** Default timeout of one command (exec or shell), ms; bounded by what is left of `wallClockMs`. */
  commandTimeoutMs: number;
  /** Bytes kept of each of stdout/stderr per command; the rest is dropped and `truncated` is set. */
  outputLimitBytes: number;
  /** Largest file one process may write, MiB (RLIMIT_FSIZE). */
  maxFileMb: number;
}

/** A host path made visible inside the sandbox. */
export interface SandboxMount {
  /** Absolute host path. */
  source: string;
  /** Absolute path inside the sandbox. */
  target: string;
  /** Default true: environments share data read-only unless they say otherwise. */
  readOnly?: boolean;
}

/**
 * What an environment asks of the sandbox of one instance; the server fills what it leaves out from its config
 * and picks the driver (bubblewrap, Apptainer) from the config too.
 */
export interface SandboxSpec {
  /**
   * Root file system: a Singularity image (a path ending in `.sif`), a directory holding a root file system, or
   * undefined for the host's own /usr (read-only) with a minimal /etc — the fastest, for tools that need only
   * what the host has.
   */
  image: string | undefined;
  limits: SandboxLimits;
  /**
   * Network access; off unless the task asks (loopback only). On, with bubblewrap's default `sandbox.networkMode`
   * 'isolated': the sandbox's own network namespace NAT'ed out by slirp4netns, the host's 127.0.0.1 and abstract UNIX
   * sockets out of reach, and so, refused inside the namespace, its other addresses, the LAN (RFC 1918, CGNAT) and
   * link-local cloud metadata (unless `sandbox.networkAllow` opens a range; slirp-network.ts, NetworkPolicy): what
   * stays is the internet and the DNS forwarder. Under 'host', and always with Apptainer: the host's own network namespace,
   * loopback services (engines' control endpoints, the server's port) included (README, Sandboxes).
   */
  network: boolean;
  mounts: readonly SandboxMount[];
  /** Environment variables of every command (on top of the driver's PATH, HOME, LANG, ...). */
  env: Readonly<Record<string, string>>;
  /** The writable workspace inside the sandbox (a size-limited tmpfs), also HOME and the default cwd. */
  workdir: string;
}

export interface ExecOptions {
  stdin?: string;
  /** Per-command timeout, ms; default the sandbox's `commandTimeoutMs`, bounded by what is left of its wall clock. */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Working directory inside the sandbox; default its workdir. */
  cwd?: string;
  env?: Readonly<Record<string, string>>;
  /**
   * Kill whatever the command left running (background, setsid()ed, double-forked processes) when it ends, as a
   * timeout does. Default false: a model's command may start a server for its next command.
   */
  killLeftovers?: boolean;
}

export interface ExecResult {
  /** null when killed by a signal. */
  exitCode: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  truncated: boolean;
  /**
   * The program exited, but a process it left running (in the background) held its stdout or stderr open: the result
   * is the program's own exit status, with the output read until shortly after it exited. Absent: false.
   */
  outputHeld?: boolean;
  durationMs: number;
}

export interface SpawnOptions {
  cwd?: string;
  env?: Readonly<Record<string, string>>;
  /** Aborting kills the process (and what it started). */
  signal?: AbortSignal;
}

/**
 * A long-lived process inside the sandbox with open pipes (the persistent shell runs on one). It is killed with
 * everything it started by `kill()`, by its signal, and by the sandbox's stop; `exited` always settles.
 */
export interface SandboxProcess {
  readonly stdin: Writable;
  readonly stdout: Readable;
  readonly stderr: Readable;
  /**
   * Settles when the process itself exited — not when its pipes closed, which processes it left running may hold open
   * for good (their output still arrives on stdout and stderr until `kill()`).
   */
  readonly exited: Promise<{ exitCode: number | null; signal: string | null }>;
  kill(): void;
}

export interface FileOptions {
  signal?: AbortSignal;
}

export interface DirEntry {
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
}

/** What one command of the persistent shell gave. */
export interface ShellResult {
  /** null when the command was killed (timeout, abort). */
  exitCode: number | null;
  /** stdout and stderr interleaved as the command wrote them, capped at the sandbox's output limit. */
  output: string;
  /** The shell's working directory after the command. */
  cwd: string;
  timedOut: boolean;
  truncated: boolean;
  /** The shell had to be restarted (after a timeout, or because the command ended it): variables were reset. */
  restarted: boolean;
  /** Why the shell was restarted, when that was not a timeout or the command ending it (e.g. a broken frame: bash-shell.ts). */
  restartReason?: string;
  durationMs: number;
}

export interface ShellRunOptions {
  /** Default the sandbox's `commandTimeoutMs`. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/**
 * One bash per sandbox that keeps its state between commands: exit code ($?), working directory and exported
 * variables carry over. A command that times out is interrupted; the shell is kept or restarted (and the result
 * says so). Commands run one at a time, in call order.
 */
export interface PersistentShell {
  run(command: string, options?: ShellRunOptions): Promise<ShellResult>;
  /** Ends the shell and what it started; idempotent. */
  close(): Promise<void>;
}

/**
 * A running sandbox: one contained process tree (its own PID namespace) that lives until `stop()`. Every
 * command, file operation and the shell run inside it, as its unprivileged user, under its limits. `stop()`
 * kills the whole tree (never by process name), unmounts and removes everything the sandbox had on the host,
 * and is idempotent; afterwards every call fails with sandbox_error.
 */
export interface Sandbox {
  readonly id: string;
  readonly spec: SandboxSpec;
  /** spec.workdir: the workspace path inside the sandbox. */
  readonly workdir: string;
  exec(argv: readonly string[], options?: ExecOptions): Promise<ExecResult>;
  spawn(argv: readonly string[], options?: SpawnOptions): SandboxProcess;
  /** The sandbox's persistent shell (started on first use, closed by `stop()`). */
  shell(): PersistentShell;
  /** Reads a file as UTF-8; fails with invalid_argument past `maxBytes` (default 16 MiB) or when it is no file. */
  readFile(path: string, options?: FileOptions & { maxBytes?: number }): Promise<string>;
  /**
   * Writes a file (parents created), as the sandbox's user: never through a symlink out of the sandbox. All or nothing
   * where the file can be replaced (a new file renamed over it once complete; replaceFileScript in sandbox-files.ts): a
   * write refused part way (file size limit, full disk, a killed writer) leaves the old content.
   */
  writeFile(path: string, content: string, options?: FileOptions): Promise<void>;
  listDir(path: string, options?: FileOptions): Promise<DirEntry[]>;
  stop(): Promise<void>;
}

/**
 * Starts sandboxes from specs. Implementations: bubblewrap (rootless, the default; runs .sif images by mounting
 * their squashfs itself), Apptainer/Singularity (where installed). Slurm placement is a later driver of this
 * same interface.
 *
 * @example
 * const sandbox = await driver.start({ image: '.cache/images/python.sif', network: false, mounts: [], env: {}, workdir: '/work', limits }, signal);
 * try { console.log((await sandbox.shell().run('python3 -c "print(1 + 1)"')).output); } finally { await sandbox.stop(); }
 */
export interface SandboxDriver {
  readonly name: string;
  /** Throws RolloutError('sandbox_error') when the driver cannot work on this machine or the image is unusable. */
  start(spec: SandboxSpec, signal?: AbortSignal): Promise<Sandbox>;
  /**
   * Removes what a crashed predecessor left (work dirs, mounts, cgroups, processes it can prove are its own).
   * Called once at server start-up, before any sandbox of this process exists.
   */
  reap?(): Promise<{ removed: number }>;
  /** Releases what the driver holds beyond its sandboxes (e.g. image mounts kept warm); called at server shutdown. */
  close?(): Promise<void>;
}
