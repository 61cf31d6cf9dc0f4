import { lstatSync, readlinkSync, readdirSync } from 'node:fs';
import { posix } from 'node:path';
import type { SandboxLimits } from './types.js';
import type { HostPython } from './host-python.js';
import { STARTED_FD } from './contained-process.js';

/**
 * Who the sandboxed program runs as, which decides how RLIMIT_NPROC can be made to hold.
 *
 * - `userns` (host uid != 0, the rootless default): bwrap makes a user namespace; prlimit sets RLIMIT_NPROC
 *   inside it, where (Linux >= 5.14) the count is per (user namespace, uid), i.e. per sandbox exec.
 * - `setuid` (host uid == 0, e.g. CI containers): the kernel never enforces RLIMIT_NPROC for host uid 0, even
 *   inside a user namespace (fork.c skips the check for INIT_USER). So bwrap runs without a user namespace
 *   and `setpriv` drops to an unprivileged uid unique to this sandbox (no capabilities, no_new_privs) before
 *   prlimit; the count is then per that uid, i.e. per sandbox.
 */
export type SandboxIdentity = { kind: 'userns' } | { kind: 'setuid'; uid: number; gid: number };

/** /etc entries a program needs (dynamic loader, locale, TLS roots, name service); the rest stays hidden. */
const ETC_ENTRIES = [
  'ld.so.cache', 'ld.so.conf', 'ld.so.conf.d', 'alternatives', 'localtime', 'nsswitch.conf', 'passwd', 'group',
  'hosts', 'host.conf', 'resolv.conf', 'gai.conf', 'protocols', 'services', 'ssl', 'ca-certificates', 'mime.types',
];

/** Paths the sandbox layout owns; Python ancestors are not re-created over them. */
const LAYOUT_ROOTS = new Set(['/', '/usr', '/etc', '/proc', '/dev', '/tmp']);

/**
 * The read-only system part of the sandbox's file system, computed once from the host: /usr bound read-only;
 * /bin, /sbin, /lib* recreated as the same symlinks (merged-/usr hosts) or bound; a minimal /etc.
 */
export function systemLayoutArgs(): string[] {
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
  // Without --perms bwrap may create /etc 0700 (seen with bwrap 0.8 as root); the dropped uid must traverse it.
  args.push('--perms', '0755', '--dir', '/etc');
  for (const name of etc) args.push('--ro-bind-try', `/etc/${name}`, `/etc/${name}`);
  return args;
}

/** RLIMIT_FSIZE when the limits do not say: one file may not fill the host's disk. */
export const DEFAULT_MAX_FILE_MB = 256;

export interface ExecCommandSpec {
  bwrapPath: string;
  systemLayout: readonly string[];
  python: HostPython | undefined;
  identity: SandboxIdentity;
  limits: SandboxLimits;
  network: boolean;
  hostWorkdir: string;
  workdir: string;
  cwd: string;
  env: Readonly<Record<string, string>>;
  argv: readonly string[];
}

/** Builds the full bwrap argv for one exec. Pure: the same spec gives the same command line. */
export function buildExecArgs(spec: ExecCommandSpec): string[] {
  const { identity, limits, python } = spec;
  const args: string[] = [];
  if (identity.kind === 'userns') {
    args.push('--unshare-all', ...(spec.network ? ['--share-net'] : []));
  } else {
    args.push('--unshare-ipc', '--unshare-pid', '--unshare-uts', '--unshare-cgroup-try', ...(spec.network ? [] : ['--unshare-net']));
  }
  args.push('--die-with-parent', '--new-session', '--hostname', 'sandbox');
  args.push(...spec.systemLayout, '--proc', '/proc', '--dev', '/dev');
  args.push('--perms', '1777', '--size', String(limits.memoryMb * 1024 * 1024), '--tmpfs', '/tmp');
  if (python) args.push(...pythonBindArgs(python, spec.workdir));
  args.push('--bind', spec.hostWorkdir, spec.workdir, '--chdir', spec.cwd, '--clearenv');
  const env = { ...defaultEnv(python, spec.workdir), ...spec.env };
  for (const [key, value] of Object.entries(env)) args.push('--setenv', key, value);
  args.push('--', ...wrapperArgv(identity, limits), ...spec.argv);
  return args;
}

function pythonBindArgs(python: HostPython, workdir: string): string[] {
  const args: string[] = [];
  const made = new Set<string>();
  for (const { source, dest } of python.roots) {
    if (dest === '/usr' || dest.startsWith('/usr/')) continue; // already visible through /usr
    // bwrap creates missing parents 0700 when the host's are (e.g. /root); the dropped uid must traverse them.
    const parts = dest.split('/').filter(Boolean);
    for (let i = 1; i < parts.length; i++) {
      const dir = `/${parts.slice(0, i).join('/')}`;
      if (LAYOUT_ROOTS.has(dir) || dir === workdir || made.has(dir)) continue;
      made.add(dir);
      args.push('--perms', '0755', '--dir', dir);
    }
    args.push('--ro-bind', source, dest);
  }
  return args;
}

function defaultEnv(python: HostPython | undefined, workdir: string): Record<string, string> {
  const path = ['/usr/local/bin', '/usr/bin', '/bin'];
  if (python && !path.includes(python.binDir)) path.unshift(python.binDir);
  return {
    PATH: path.join(':'),
    HOME: workdir,
    TMPDIR: '/tmp',
    LANG: 'C.UTF-8',
    LC_ALL: 'C.UTF-8',
    TERM: 'dumb',
    PYTHONDONTWRITEBYTECODE: '1',
    PYTHONUNBUFFERED: '1',
    PYTHONIOENCODING: 'utf-8',
  };
}

/**
 * Inside bwrap, before the user's argv: (setpriv →) prlimit → sh, which writes one byte to fd 3 and execs the
 * argv with fd 3 closed. The byte tells the host that setup succeeded, so a bwrap failure (exit 1, "bwrap: ..."
 * on stderr) is never confused with the program's own exit 1, and the program cannot fake either.
 */
export function wrapperArgv(identity: SandboxIdentity, limits: SandboxLimits): string[] {
  const argv: string[] = [];
  if (identity.kind === 'setuid') {
    argv.push(
      'setpriv', '--reuid', String(identity.uid), '--regid', String(identity.gid), '--clear-groups',
      '--no-new-privs', '--inh-caps', '-all', '--bounding-set', '-all', '--',
    );
  }
  argv.push(
    'prlimit', `--as=${limits.memoryMb * 1024 * 1024}`, `--nproc=${limits.maxProcesses}`,
    `--fsize=${(limits.maxFileMb ?? DEFAULT_MAX_FILE_MB) * 1024 * 1024}`, '--core=0', '--',
    '/bin/sh', '-c', `printf 1 >&${STARTED_FD}; exec "$@" ${STARTED_FD}>&-`, 'sandbox-exec',
  );
  return argv;
}

/** Resolves an exec cwd against the work dir; relative paths are relative to it. */
export function resolveCwd(workdir: string, cwd: string | undefined): string {
  if (cwd === undefined || cwd === '') return workdir;
  return posix.normalize(cwd.startsWith('/') ? cwd : posix.join(workdir, cwd));
}
