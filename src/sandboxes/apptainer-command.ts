import type { SandboxLimits, SandboxMount } from './types.js';

/**
 * Pure command-line builders for the Apptainer/Singularity driver. Nothing here spawns a process, so the golden
 * tests in test/sandboxes/apptainer-command.test.ts pin the exact argv.
 *
 * Followed: the Apptainer 1.3/1.4 CLI (cmd/internal/cli/action_flags.go, instance_stop_linux.go, the user guide
 * pages "Bind Paths and Mounts", "Network virtualization", "Limiting Container Resources", "Environment and
 * Metadata") and the `singularity` 3.x/4.x man pages, which share every flag used here:
 * - `--containall` (-C): contain file systems, PID, IPC and environment (implies --contain, --pid, --ipc, --cleanenv).
 * - `--no-mount home,cwd,tmp`: disables those `mount xxx` entries of apptainer.conf, comma-separated.
 * - `--writable-tmpfs`: the image's root is writable through a tmpfs overlay (size set by the admin's
 *   `sessiondir max size`), so programs may write anywhere without touching the image or the host.
 * - `overlay create --size MiB --sparse --create-dir DIR IMG` (Apptainer 1.2+, SingularityCE 4.x; the "Persistent
 *   Overlays" page): an EXT3 image of that size, sparse (no disk used until written), with DIR made in its upper
 *   layer and owned by the caller; `--create-dir` may repeat. `instance start --overlay IMG` instead of
 *   `--writable-tmpfs` makes the whole root writable through it: every write of the sandbox (workspace, /tmp,
 *   anywhere) lands in the image, so its size is a disk quota of the whole sandbox (ENOSPC past it). As non-root this
 *   needs fuse2fs and fuse-overlayfs on the host (root and setuid installations mount ext3 themselves).
 * - `--net --network none`: a new network namespace with loopback only; `none` must be used alone and is the one
 *   network type unprivileged users may ask for by default.
 * - `--bind src:dest:ro|rw`: a bind spec; `,` separates specs and `:` fields, so neither may appear in a path.
 * - `--memory <bytes>`, `--pids-limit <n>`: cgroup limits; as non-root they need cgroups v2 with systemd
 *   delegation (root: v1 or v2). See ApptainerDriverOptions.limits for the fallback.
 * - `--no-privs`: drops every capability of root inside (a no-op as non-root; the server may run as root).
 * - `exec --cleanenv --pwd DIR instance://NAME ...`: `--pwd` is the Singularity 3.x name, kept as a hidden
 *   synonym of `--cwd` by Apptainer, so it works on both.
 * - `instance stop [--timeout S | --force] NAME`: SIGINT, then SIGKILL after S seconds; `--force` sends SIGKILL.
 * - `instance list --json`: `{"instances":[{"instance","pid","img","ip","logErrPath","logOutPath"}]}`.
 * - global `--silent` (-s): only errors on stderr, so an exec's stderr is the program's own.
 *
 * Environment variables are not passed with `--env` (which splits values at commas and evaluates `$VAR`) nor
 * `--env-file` (a shell script, evaluated): the in-sandbox wrapper sets them with `env -i NAME=VALUE`, which
 * takes every byte as it is.
 */

/** Prefix of every instance name and host dir the driver creates: `reap()` touches nothing else. */
export const APPTAINER_PREFIX = 'rollout-apt';

/** Exit code of the in-sandbox wrapper when the requested cwd is not a directory (with CWD_MARKER on stderr). */
export const CWD_EXIT_CODE = 125;
export const CWD_MARKER = 'rollout: no such directory: ';

/** Environment variable that tags every process an exec starts, so it can be killed inside the instance. */
export const EXEC_TAG = 'ROLLOUT_EXEC';

export interface InstanceStartSpec {
  /** The image as given to apptainer: a .sif file or a root file system directory. */
  image: string;
  name: string;
  network: boolean;
  /**
   * Where the workspace (`workdir`) lives: in the sandbox's overlay image (made by overlayCreateArgs with `workdir`
   * among its dirs; the root's writable layer and the disk quota), or a host dir bound read-write at `workdir` with
   * the root writable through `--writable-tmpfs` (no quota: the fallback where overlay images cannot be used).
   */
  workspace: { overlay: string } | { hostWorkdir: string };
  workdir: string;
  mounts: readonly SandboxMount[];
  /** Pass cgroup limits (`--memory`, `--pids-limit`); false when they are enforced per exec by rlimits. */
  cgroupLimits: boolean;
  limits: Pick<SandboxLimits, 'memoryMb' | 'maxProcesses'>;
}

/** Throws a plain Error naming the path when it cannot be written in a `--bind` spec. */
export function bindSpec(source: string, target: string, readOnly: boolean): string {
  for (const path of [source, target]) {
    if (!path.startsWith('/')) throw new Error(`bind path ${JSON.stringify(path)} must be absolute`);
    if (/[,:\0\n]/.test(path)) throw new Error(`bind path ${JSON.stringify(path)} contains ',', ':', a newline or NUL, which --bind cannot express`);
  }
  return `${source}:${target}:${readOnly ? 'ro' : 'rw'}`;
}

/**
 * `apptainer --silent overlay create --size MiB --sparse --create-dir DIR... IMG`: the sandbox's writable layer. The
 * dirs are the workspace and every mount target inside it (a bind needs its target to exist).
 */
export function overlayCreateArgs(spec: { path: string; sizeMb: number; dirs: readonly string[] }): string[] {
  if (!spec.path.startsWith('/')) throw new Error(`overlay path ${JSON.stringify(spec.path)} must be absolute`);
  if (!Number.isInteger(spec.sizeMb) || spec.sizeMb < 1) throw new Error(`overlay size ${spec.sizeMb} MiB must be a positive integer`);
  const args = ['--silent', 'overlay', 'create', '--size', String(spec.sizeMb), '--sparse'];
  for (const dir of spec.dirs) {
    // --create-dir is a string slice flag: a comma would split the path.
    if (!dir.startsWith('/') || /[,\0\n]/.test(dir)) throw new Error(`overlay dir ${JSON.stringify(dir)} must be absolute, without ',', a newline or NUL`);
    args.push('--create-dir', dir);
  }
  args.push(spec.path);
  return args;
}

/** `apptainer --silent instance start ... IMAGE NAME`. The workspace comes first; later binds may nest in it. */
export function instanceStartArgs(spec: InstanceStartSpec): string[] {
  const overlay = 'overlay' in spec.workspace ? spec.workspace.overlay : undefined;
  // --overlay is a string slice flag with an optional ':ro' suffix: neither ',' nor ':' may appear in the path.
  if (overlay !== undefined && (!overlay.startsWith('/') || /[,:\0\n]/.test(overlay))) throw new Error(`overlay path ${JSON.stringify(overlay)} must be absolute, without ',', ':', a newline or NUL`);
  const args = ['--silent', 'instance', 'start', '--containall', '--no-mount', 'home,cwd,tmp', ...(overlay === undefined ? ['--writable-tmpfs'] : ['--overlay', overlay]), '--no-privs'];
  if (!spec.network) args.push('--net', '--network', 'none');
  if (spec.cgroupLimits) {
    args.push('--memory', String(spec.limits.memoryMb * 1024 * 1024), '--pids-limit', String(spec.limits.maxProcesses));
  }
  if ('hostWorkdir' in spec.workspace) args.push('--bind', bindSpec(spec.workspace.hostWorkdir, spec.workdir, false));
  for (const m of spec.mounts) args.push('--bind', bindSpec(m.source, m.target, m.readOnly ?? true));
  args.push(spec.image, spec.name);
  return args;
}

export interface ExecSpec {
  name: string;
  workdir: string;
  /** Directory the command runs in, inside the sandbox (absolute). */
  cwd: string;
  /** The full environment of the command: nothing else is inherited. */
  env: Readonly<Record<string, string>>;
  /** Unique per exec; set as EXEC_TAG in the command's environment. */
  tag: string;
  /** Per-process limits applied by the wrapper (see wrapperScript). */
  rlimits: WrapperLimits;
  argv: readonly string[];
}

export interface WrapperLimits {
  /** RLIMIT_FSIZE, MiB: always set (per process, as SandboxLimits.maxFileMb says). */
  maxFileMb: number;
  /** RLIMIT_AS (MiB) and RLIMIT_NPROC: only in the rlimit fallback, when cgroups cannot hold the whole sandbox. */
  memoryMb?: number;
  maxProcesses?: number;
}

/**
 * `apptainer --silent exec --cleanenv --pwd WORKDIR instance://NAME /bin/sh -c SCRIPT rollout-exec CWD ARGV...`.
 * The wrapper (see wrapperScript) changes to CWD, applies rlimits and execs `env -i` with exactly `env`.
 */
export function execArgs(spec: ExecSpec): string[] {
  if (spec.argv.length === 0) throw new Error('argv must not be empty');
  if (spec.argv[0]?.includes('=')) throw new Error("argv[0] must not contain '=' (env would read it as a variable)");
  const env = { ...spec.env, [EXEC_TAG]: spec.tag };
  const assignments = Object.entries(env).map(([k, v]) => `${k}=${v}`);
  return [
    '--silent', 'exec', '--cleanenv', '--pwd', spec.workdir, `instance://${spec.name}`,
    '/bin/sh', '-c', wrapperScript(spec.rlimits), 'rollout-exec', spec.cwd, ...assignments, ...spec.argv,
  ];
}

/**
 * The POSIX sh prelude of every exec. Positional parameters: $1 the cwd, then the NAME=VALUE assignments, then
 * the argv (env reads assignments up to the first word without '=', which argv[0] is checked to be). Why a script and not apptainer flags: the values never pass through a shell or apptainer's
 * parsing (they stay positional parameters), and one exec does cwd, limits and environment in a single process
 * that then `exec`s the program, so the program's PID is the exec's.
 *
 * `ulimit -f` is POSIX (512-byte blocks; bash as sh is in POSIX mode). The rlimit fallback uses util-linux
 * `prlimit`, which Debian images have (Priority: required); RLIMIT_NPROC counts per user, so it is approximate.
 */
export function wrapperScript(limits: WrapperLimits): string {
  const lines = [
    `cd -- "$1" 2>/dev/null || { printf '%s%s\\n' '${CWD_MARKER}' "$1" >&2; exit ${CWD_EXIT_CODE}; }`,
    'shift',
    `ulimit -f ${limits.maxFileMb * 2048}`,
  ];
  const prlimit: string[] = [];
  if (limits.memoryMb !== undefined) prlimit.push(`--as=${limits.memoryMb * 1024 * 1024}`);
  if (limits.maxProcesses !== undefined) prlimit.push(`--nproc=${limits.maxProcesses}`);
  lines.push(`exec ${prlimit.length > 0 ? `prlimit ${prlimit.join(' ')} -- ` : ''}env -i "$@"`);
  return lines.join('\n');
}

/**
 * A script run inside the instance that SIGKILLs every process whose environment carries `ROLLOUT_EXEC=<tag>`:
 * what an exec left running after its host-side process was killed (a timeout, an abort). Best effort — a
 * program can clear its environment — and the instance's stop (its PID namespace going down) is the guarantee.
 */
export function killTaggedArgs(name: string, tag: string): string[] {
  if (!/^[A-Za-z0-9-]+$/.test(tag)) throw new Error(`bad exec tag ${tag}`);
  const script = [
    'for d in /proc/[0-9]*; do',
    `  if tr '\\0' '\\n' < "$d/environ" 2>/dev/null | grep -qx '${EXEC_TAG}=${tag}'; then kill -9 "\${d#/proc/}" 2>/dev/null; fi`,
    'done',
    'exit 0',
  ].join('\n');
  return ['--silent', 'exec', '--cleanenv', '--pwd', '/', `instance://${name}`, '/bin/sh', '-c', script];
}

/** `instance stop`: SIGINT then SIGKILL after `timeoutS`, or SIGKILL at once with `force`. */
export function instanceStopArgs(name: string, how: { force: true } | { timeoutS: number }): string[] {
  const mode = 'force' in how ? ['--force'] : ['--timeout', String(how.timeoutS)];
  return ['--silent', 'instance', 'stop', ...mode, name];
}

export function instanceListArgs(): string[] {
  return ['--silent', 'instance', 'list', '--json'];
}

/**
 * The environment the apptainer binary itself runs with (not the sandbox's: that is set by the wrapper). Only
 * what it needs: PATH, the user's identity and HOME (instance state lives under ~/.apptainer), and the session bus
 * and runtime dir that rootless cgroups go through systemd with. APPTAINER_* / SINGULARITY_* variables of the
 * server are dropped on purpose: a cluster module's APPTAINER_BINDPATH would silently bind host paths into
 * every sandbox.
 */
export function apptainerHostEnv(env: NodeJS.ProcessEnv): Record<string, string> {
  const out: Record<string, string> = { PATH: env.PATH ?? '/usr/local/bin:/usr/bin:/bin', LANG: 'C.UTF-8' };
  for (const key of ['HOME', 'USER', 'LOGNAME', 'XDG_RUNTIME_DIR', 'DBUS_SESSION_BUS_ADDRESS'] as const) {
    const value = env[key];
    if (value !== undefined) out[key] = value;
  }
  return out;
}
