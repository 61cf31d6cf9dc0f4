import { lstatSync, readlinkSync, readdirSync } from 'node:fs';
import { posix } from 'node:path';
import type { HostPython } from './host-python.js';
import { SANDBOX_INIT_PATH } from './init/sandbox-init.js';
import type { SandboxLimits } from './types.js';

/**
 * Who the sandbox's processes are on the host.
 *
 * - `setuid` (the server runs as host root): bwrap itself runs as an unprivileged host uid unique to the sandbox
 *   (setpriv before bwrap), so the sandbox is exactly the rootless case seen from the kernel: its own user
 *   namespace (which `--disable-userns` needs), and files, signals and sockets of a uid nobody else has. Host
 *   paths that uid cannot reach (a Python under /root) are first bound by root in a private mount namespace
 *   that dies with the sandbox ("staging"), then bound into the sandbox by bwrap.
 * - `userns` (the server is not root): bwrap runs as the server's uid in its own user namespace.
 * Either way the processes are uid/gid SANDBOX_UID inside, with no capabilities and no_new_privs.
 */
export type SandboxIdentity = { kind: 'userns' } | { kind: 'setuid'; uid: number; gid: number };

/** The uid and gid of every process inside a sandbox (mapped to the host uid above). */
export const SANDBOX_UID = 1000;

/** /etc entries a program needs (dynamic loader, locale, TLS roots, name service); the rest stays hidden. */
const ETC_ENTRIES = [
  'ld.so.cache', 'ld.so.conf', 'ld.so.conf.d', 'alternatives', 'localtime', 'nsswitch.conf', 'passwd', 'group',
  'hosts', 'host.conf', 'resolv.conf', 'gai.conf', 'protocols', 'services', 'ssl', 'ca-certificates', 'mime.types',
];
/** Top-level entries of an image that the sandbox replaces with its own. */
const IMAGE_SKIP = new Set(['proc', 'dev', 'sys', 'tmp', 'run']);

/** A host path bound into the sandbox. */
export interface Bind {
  source: string;
  dest: string;
  readOnly: boolean;
}

/** The file system of a sandbox before its workspace: bwrap args that need no staging, plus binds that may. */
export interface Layout {
  args: string[];
  binds: Bind[];
  /** An image root whose top-level entries are bound read-only (the root itself is staged once). */
  image?: { root: string; entries: string[] };
}

/**
 * The host's own system, computed once: /usr read-only; /bin, /sbin, /lib* as the same symlinks (merged-/usr) or
 * bound; a minimal /etc. Everything here is world-readable, so it never needs staging.
 */
export function hostLayout(): Layout {
  const args = ['--ro-bind', '/usr', '/usr'];
  for (const top of ['/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32']) {
    try {
      const st = lstatSync(top);
      if (st.isSymbolicLink()) args.push('--symlink', readlinkSync(top), top);
      else if (st.isDirectory()) args.push('--ro-bind', top, top);
    } catch {
      // Absent on this host.
    }
  }
  const etc = new Set(ETC_ENTRIES);
  try {
    for (const name of readdirSync('/etc')) if (/^python3(\.\d+)?$/.test(name)) etc.add(name);
  } catch {
    // No /etc listing: keep the fixed set.
  }
  args.push('--perms', '0755', '--dir', '/etc');
  for (const name of etc) args.push('--ro-bind-try', `/etc/${name}`, `/etc/${name}`);
  return { args, binds: [] };
}

/**
 * An image root: each top-level entry bound read-only (symlinks recreated), on bwrap's own root. Why not bind the
 * root itself at /: a read-only root cannot get the mount points bwrap must create (the workspace, mount targets).
 */
export function imageLayout(root: string): Layout {
  const args: string[] = [];
  const entries: string[] = [];
  for (const entry of readdirSync(root, { withFileTypes: true })) {
    if (IMAGE_SKIP.has(entry.name)) continue;
    if (entry.isSymbolicLink()) args.push('--symlink', readlinkSync(posix.join(root, entry.name)), `/${entry.name}`);
    else entries.push(entry.name);
  }
  return { args, binds: [], image: { root, entries } };
}

/** The host Python installation (when the host layout is used), bound at the paths Python reports. */
export function pythonBinds(python: HostPython): Bind[] {
  return python.roots.filter(({ dest }) => dest !== '/usr' && !dest.startsWith('/usr/')).map(({ source, dest }) => ({ source, dest, readOnly: true }));
}

export interface HolderCommandSpec {
  bwrapPath: string;
  identity: SandboxIdentity;
  limits: SandboxLimits;
  /**
   * Whether the sandbox shares the host's network namespace (`sandbox.networkMode` 'host'); false gives it its own,
   * loopback only until slirp4netns attaches its tap (slirp-network.ts).
   */
  network: boolean;
  layout: Layout;
  /**
   * Descriptor whose contents become the sandbox's /etc/resolv.conf (`--ro-bind-data`), over the layout's: the
   * isolated network's DNS forwarder (slirp-network.ts), which the host's resolver, if on loopback, is not.
   */
  resolvConfFd?: number;
  /** Binds applied after the workspace exists (spec.mounts may target paths inside it). */
  mounts: Bind[];
  workdir: string;
  /** cgroup.procs files the chain joins before anything else runs. */
  cgroupProcs: readonly string[];
  /** Host dir over which staging mounts a private tmpfs (setuid identity only). */
  stageDir: string;
  /** Descriptor bwrap writes its --info-fd JSON (child-pid) to. */
  infoFd: number;
  /**
   * Host path of the sandbox init (init/sandbox-init.c): bound at SANDBOX_INIT_PATH and run as the namespace's pid 1
   * (`--as-pid-1`), the holder itself. Without it, bwrap's init is pid 1 and a holder shell pid 2, which the
   * sandbox's own processes can kill (`kill -9 -1`), ending the sandbox.
   */
  init?: string;
}

const JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"';
/**
 * JOIN for a command: also marks it (and all it starts) first in line for the OOM killer. Raising oom_score_adj
 * needs no privilege, unlike lowering the holder's (which needs CAP_SYS_RESOURCE): either way the sandbox's memory
 * limit kills the user's processes before the processes that hold the sandbox.
 */
const EXEC_JOIN = `{ echo 1000 > /proc/self/oom_score_adj; } 2>/dev/null; ${JOIN}`;
const STAGE = [
  'stage=$1; shift',
  'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift',
  'mount -t tmpfs -o size=64k,mode=0755 rollout-stage "$stage" || exit 125',
  'i=0',
  'while [ "$1" != -- ]; do',
  '  if [ -d "$1" ]; then mkdir "$stage/$i"; else : > "$stage/$i"; fi || exit 125',
  '  mount --rbind "$1" "$stage/$i" || exit 125',
  '  i=$((i + 1)); shift',
  'done; shift; exec "$@"',
].join('\n');
/** The fallback holder (no init binary): says it is up, then lives until its stdin (the server's control pipe) closes. */
const HOLDER = 'printf r; read -r _ || true';

/**
 * The host command line that starts a sandbox: [join cgroups →] [stage → setpriv →] bwrap → holder. Pure: the same
 * spec gives the same argv.
 */
export function buildHolderArgv(spec: HolderCommandSpec): string[] {
  const { identity, limits } = spec;
  const staged = identity.kind === 'setuid';
  const image = spec.layout.image;
  // Sources in staging order: the image root (if any), then the layout's binds, then spec.mounts.
  const sources = [
    ...(image ? [image.root] : []), ...spec.layout.binds.map((b) => b.source), ...spec.mounts.map((b) => b.source),
    ...(spec.init !== undefined ? [spec.init] : []),
  ];
  const source = (i: number): string => (staged ? `${spec.stageDir}/${i}` : sources[i]!);
  const offset = image ? 1 : 0;
  const bwrap = [
    spec.bwrapPath, '--unshare-user', '--uid', String(SANDBOX_UID), '--gid', String(SANDBOX_UID), '--disable-userns',
    '--unshare-pid', ...(spec.init !== undefined ? ['--as-pid-1'] : []), '--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try', ...(spec.network ? [] : ['--unshare-net']),
    '--die-with-parent', '--new-session', '--hostname', 'sandbox', ...spec.layout.args,
  ];
  const bindArgs = (bind: Bind, i: number): string[] => {
    const made = parentDirs(bind.dest, spec.workdir).flatMap((dir) => ['--perms', '0755', '--dir', dir]);
    return [...made, bind.readOnly ? '--ro-bind' : '--bind', source(i), bind.dest];
  };
  for (const name of image?.entries ?? []) bwrap.push('--ro-bind', `${source(0)}/${name}`, `/${name}`);
  const nLayout = offset + spec.layout.binds.length;
  spec.layout.binds.forEach((b, i) => bwrap.push(...bindArgs(b, offset + i)));
  if (spec.resolvConfFd !== undefined) bwrap.push('--ro-bind-data', String(spec.resolvConfFd), '/etc/resolv.conf');
  // bwrap's /dev is a tmpfs of half the host's RAM owned by the sandbox's user: /dev/shm (POSIX shared memory,
  // multiprocessing's semaphores) gets a tmpfs of its own, sized, and /dev itself is made read-only (not recursive:
  // the device binds, devpts and /dev/shm keep their flags), so no file there escapes the budget below.
  bwrap.push('--proc', '/proc', '--dev', '/dev');
  bwrap.push('--size', String(shmSizeMb(limits) * 1024 * 1024), '--perms', '1777', '--tmpfs', '/dev/shm', '--remount-ro', '/dev');
  const bytes = String(tmpfsSizeMb(limits) * 1024 * 1024);
  bwrap.push('--size', bytes, '--perms', '1777', '--tmpfs', '/tmp');
  bwrap.push('--size', bytes, '--perms', '0755', '--tmpfs', spec.workdir);
  spec.mounts.forEach((b, i) => bwrap.push(...bindArgs(b, nLayout + i)));
  if (spec.init !== undefined) bwrap.push('--ro-bind', source(nLayout + spec.mounts.length), SANDBOX_INIT_PATH);
  const holder = spec.init !== undefined ? [SANDBOX_INIT_PATH] : ['/bin/sh', '-c', HOLDER];
  // The root is bwrap's own tmpfs (holding /etc and mount points): read-only once everything is mounted.
  bwrap.push('--remount-ro', '/', '--chdir', spec.workdir, '--info-fd', String(spec.infoFd), '--clearenv', '--', ...holder);
  if (staged) {
    return [
      'unshare', '-m', '--propagation', 'private', '/bin/sh', '-c', STAGE, 'rollout-stage', spec.stageDir,
      ...spec.cgroupProcs, '--', ...sources, '--',
      'setpriv', '--reuid', String(identity.uid), '--regid', String(identity.gid), '--clear-groups', '--', ...bwrap,
    ];
  }
  return spec.cgroupProcs.length > 0 ? ['/bin/sh', '-c', JOIN, 'rollout-join', ...spec.cgroupProcs, '--', ...bwrap] : bwrap;
}

/**
 * Size of each of the sandbox's two tmpfs (/tmp and the workspace), MiB: diskMb, but at most what leaves a quarter
 * of the memory limit (64 MiB at least, half of it at most) free of files. Why: tmpfs pages count against the
 * sandbox's memory cgroup and cannot be reclaimed by killing processes, so 2 × diskMb ≥ memoryMb (the defaults:
 * 512 and 1024) let files alone fill the cgroup, whose OOM killer then had nothing left to kill but the sandbox's
 * launchers and holder. With this cap the OOM killer always finds the user's processes first.
 */
export function tmpfsSizeMb(limits: Pick<SandboxLimits, 'diskMb' | 'memoryMb'>): number {
  const reserve = memoryReserveMb(limits.memoryMb);
  return Math.max(1, Math.min(limits.diskMb, Math.floor((limits.memoryMb - reserve) / 2)));
}

/**
 * Size of the sandbox's /dev/shm, MiB: a quarter of the reserve tmpfsSizeMb leaves free of files (64 MiB and diskMb at
 * most, 1 at least), so the three tmpfs together still leave three quarters of that reserve to the user's processes.
 */
export function shmSizeMb(limits: Pick<SandboxLimits, 'diskMb' | 'memoryMb'>): number {
  return Math.max(1, Math.min(64, limits.diskMb, Math.floor(memoryReserveMb(limits.memoryMb) / 4)));
}

function memoryReserveMb(memoryMb: number): number {
  return Math.max(Math.floor(memoryMb / 4), Math.min(64, Math.floor(memoryMb / 2)));
}

/** Directories bwrap must create (0755) above a bind target; the root, /usr and the workspace already exist. */
function parentDirs(dest: string, workdir: string): string[] {
  const parts = dest.split('/').filter(Boolean);
  const out: string[] = [];
  for (let i = 1; i < parts.length; i++) {
    const dir = `/${parts.slice(0, i).join('/')}`;
    if (dir === '/usr' || dir === '/etc' || dir === '/tmp' || dir === workdir || workdir.startsWith(`${dir}/`)) continue;
    out.push(dir);
  }
  return out;
}

export interface ExecCommandSpec {
  limits: SandboxLimits;
  /**
   * Descriptors (in the launched process) of the holder's namespaces and root, opened once at start: a reused
   * holder pid can then never send a command into the wrong namespaces.
   */
  nsFds: NamespaceFds;
  /** Whether the sandbox's limits hold through cgroups (else RLIMIT_AS and RLIMIT_NPROC per process). */
  cgroups: boolean;
  cgroupProcs: readonly string[];
  cwd: string;
  env: Readonly<Record<string, string>>;
  argv: readonly string[];
  /**
   * Path inside the sandbox of the descriptor closer (the sandbox init's `--keep-fds` mode, SANDBOX_INIT_PATH), when
   * the sandbox has one: it closes the namespace descriptors nsenter leaves open before the sandbox's shell runs.
   * Without it the shell closes those it can name (up to 9: POSIX sh has no multi-digit redirections), and the ones
   * above 9 are closed first by CLOSE_HIGH (the image's shell where it takes them, else the image's bash).
   */
  closer?: string;
}

/** The namespaces a command joins: nsenter's option and the file under /proc/PID/ns. User first: it grants the rest. */
export const NAMESPACES = [
  { flag: 'user', file: 'user' }, { flag: 'mount', file: 'mnt' }, { flag: 'pid', file: 'pid' }, { flag: 'net', file: 'net' },
  { flag: 'ipc', file: 'ipc' }, { flag: 'uts', file: 'uts' }, { flag: 'cgroup', file: 'cgroup' },
] as const;

/**
 * Descriptor numbers of the holder's namespace files and root directory in a launched command, and `owner`: the user
 * namespace that owns the others, when it is not the holder's own (see HeldNamespaces.owner in bwrap-holder.ts).
 */
export type NamespaceFds = Record<(typeof NAMESPACES)[number]['file'] | 'root', number> & { owner?: number };

/** Descriptor the in-sandbox wrapper writes one byte to: `1` right before exec'ing the argv, `c` for a bad cwd. */
export const STARTED_FD = 3;
const INNER = [
  `cd -- "$1" 2>/dev/null || { printf c >&${STARTED_FD}; exit 126; }; shift`,
  'while [ "$1" != -- ]; do export "$1"; shift; done; shift',
  `{ printf 1 >&${STARTED_FD}; } 2>/dev/null; exec "$@" ${STARTED_FD}>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-`,
].join('\n');

/**
 * The fallback closer of the descriptors above 9 (no sandbox init), run inside the sandbox: $1 lists them, the rest is
 * the command. A shell that takes multi-digit descriptors (bash, busybox's ash) closes them itself; dash reads `10>&-`
 * as the word 10 and a redirection, so the probe runs in a subshell with a PATH where no command `10` can be found, and
 * dash hands them to the image's bash (through env: bash exports SHLVL into what it execs). Without either (a dash-only
 * image) they stay open: the cgroup namespace and root of the sandbox itself, which give nothing its own processes lack.
 */
const CLOSE_HIGH = [
  'c=; for f in $1; do c="$c $f>&-"; done; shift',
  'if (PATH=/nonexistent-rollout; exec 10</dev/null) 2>/dev/null; then eval "exec \\"\\$@\\"$c"; fi',
  'command -v bash >/dev/null 2>&1 && command -v env >/dev/null 2>&1 && exec bash -c "exec env -u SHLVL \\"\\$@\\"$c" bash "$@"',
  'exec "$@"',
].join('\n');

/**
 * The host command line of one command inside a running sandbox: [join its cgroups →] prlimit → setpriv
 * (no_new_privs) → nsenter (the holder's user, mount, pid, net, ipc, uts and cgroup namespaces and its root;
 * uid/gid SANDBOX_UID) → [descriptor closer →] sh (cd, environment, started byte) → argv, which gets descriptors 0, 1
 * and 2 only (the host end of the chain is wrapped in the host's closer by the caller: see fd-closer.ts). The
 * environment travels as arguments, not as the host chain's own environment, so no variable (LD_PRELOAD, ...) ever
 * reaches a host binary.
 */
export function buildExecArgv(spec: ExecCommandSpec): string[] {
  const { limits } = spec;
  const rlimits = [`--fsize=${limits.maxFileMb * 1024 * 1024}`, '--core=0'];
  if (!spec.cgroups) rlimits.push(`--as=${limits.memoryMb * 1024 * 1024}`, `--nproc=${limits.maxProcesses}`);
  const argv = [
    'prlimit', ...rlimits, '--', 'setpriv', '--no-new-privs', '--', ...enterOwnerArgv(spec.nsFds),
    'nsenter', ...NAMESPACES.map((ns) => `--${ns.flag}=/proc/self/fd/${spec.nsFds[ns.file]}`), `--root=/proc/self/fd/${spec.nsFds.root}`,
    ...(spec.nsFds.owner !== undefined ? ['--preserve-credentials'] : []), '-S', String(SANDBOX_UID), '-G', String(SANDBOX_UID), '--',
    ...(spec.closer !== undefined ? [spec.closer, '--keep-fds', String(STARTED_FD), '--'] : closeHighArgv(spec.nsFds)),
    '/bin/sh', '-c', INNER, 'sandbox-exec', spec.cwd, ...Object.entries(spec.env).map(([k, v]) => `${k}=${v}`), '--', ...spec.argv,
  ];
  return spec.cgroupProcs.length > 0 ? ['/bin/sh', '-c', EXEC_JOIN, 'rollout-join', ...spec.cgroupProcs, '--', ...argv] : argv;
}

/**
 * The step before nsenter when the sandbox's namespaces are owned by a user namespace other than the holder's (a
 * server that is not root: bwrap's `--disable-userns` runs the sandbox in a nested user namespace, while its mount,
 * PID, network, ... namespaces belong to the outer one). A non-root nsenter can only join them with CAP_SYS_ADMIN in
 * their owner, which entering the nested user namespace first does not give (the kernel refused: "reassociate to
 * namespace 'ns/cgroup' failed: Operation not permitted"). So this nsenter joins the owner first (the server's uid is
 * root there: full capabilities over it and its descendants), and the next one joins the rest, then the nested user
 * namespace last, as SANDBOX_UID. `--preserve-credentials` in both: in these user namespaces (setgroups denied, as
 * bwrap leaves them) nsenter's own setgroups() would fail; uid and gid are still set by the second one's -S/-G.
 */
function enterOwnerArgv(nsFds: NamespaceFds): string[] {
  return nsFds.owner === undefined ? [] : ['nsenter', '--preserve-credentials', `--user=/proc/self/fd/${nsFds.owner}`, '--'];
}

/** CLOSE_HIGH's argv for the namespace descriptors above 9 (none: no step). */
function closeHighArgv(nsFds: NamespaceFds): string[] {
  const high = Object.values(nsFds).filter((fd) => fd > 9);
  return high.length === 0 ? [] : ['/bin/sh', '-c', CLOSE_HIGH, 'sandbox-close', high.join(' ')];
}

/** Variables every command gets (before spec.env and the command's own). */
export function defaultEnv(python: HostPython | undefined, workdir: string): Record<string, string> {
  const path = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin'];
  if (python && !path.includes(python.binDir)) path.unshift(python.binDir);
  return {
    PATH: path.join(':'), HOME: workdir, TMPDIR: '/tmp', LANG: 'C.UTF-8', LC_ALL: 'C.UTF-8', TERM: 'dumb',
    PYTHONDONTWRITEBYTECODE: '1', PYTHONUNBUFFERED: '1', PYTHONIOENCODING: 'utf-8',
  };
}

/** Resolves a path against the workspace: relative paths are relative to it; the result is normalized. */
export function resolveInSandbox(workdir: string, path: string): string {
  return posix.normalize(path.startsWith('/') ? path : posix.join(workdir, path));
}
