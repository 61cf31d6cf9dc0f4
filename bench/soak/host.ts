import { readdirSync, readFileSync } from 'node:fs';

/**
 * What the soak reads of the host from /proc and /sys/fs/cgroup (Linux, cgroup v1 as on this machine): a process's
 * memory, descendants, tagged processes, and the sandbox cgroups and image mounts a server left. Mirrors
 * test/sandboxes/helpers.ts, which checks the same things for one driver in-process.
 */
export interface ProcessSample {
  /** Resident set, bytes (VmRSS). */
  rss: number;
  /** Peak resident set so far, bytes (VmHWM). */
  hwm: number;
  threads: number;
  /** Open file descriptors (sockets, pipes, files): a leak of connections or pipes shows here first. */
  fds: number;
  /** CPU time the process has used (user + system), seconds. */
  cpuSeconds: number;
}

export function sampleProcess(pid: number): ProcessSample | undefined {
  let status: string;
  try {
    status = readFileSync(`/proc/${pid}/status`, 'utf8');
  } catch {
    return undefined;
  }
  const field = (name: string): number => Number(new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? 0);
  let fds = 0;
  try {
    fds = readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    // Gone meanwhile.
  }
  // utime and stime are fields 14 and 15 of /proc/PID/stat, in clock ticks (USER_HZ = 100 on Linux).
  const fields = stat(pid);
  const cpuSeconds = fields ? (Number(fields[11]) + Number(fields[12])) / 100 : 0;
  return { rss: field('VmRSS') * 1024, hwm: field('VmHWM') * 1024, threads: field('Threads'), fds, cpuSeconds };
}

function pids(): number[] {
  return readdirSync('/proc').filter((e) => /^\d+$/.test(e)).map(Number);
}

/** Fields after the command name in /proc/PID/stat (state is [0], ppid [1]), or undefined when gone. */
function stat(pid: number): string[] | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return text.slice(text.lastIndexOf(')') + 2).split(' ');
  } catch {
    return undefined;
  }
}

function comm(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  } catch {
    return '?';
  }
}

export interface HostProcessInfo {
  pid: number;
  comm: string;
  state: string;
}

/** Every live (non-zombie) descendant of `root`. */
export function descendants(root: number): HostProcessInfo[] {
  const children = new Map<number, number[]>();
  const info = new Map<number, HostProcessInfo>();
  for (const pid of pids()) {
    const fields = stat(pid);
    if (!fields) continue;
    const ppid = Number(fields[1]);
    info.set(pid, { pid, comm: comm(pid), state: fields[0] ?? '?' });
    children.set(ppid, [...(children.get(ppid) ?? []), pid]);
  }
  const out: HostProcessInfo[] = [];
  const walk = (pid: number): void => {
    for (const child of children.get(pid) ?? []) {
      const i = info.get(child);
      if (i && i.state !== 'Z') out.push(i);
      walk(child);
    }
  };
  walk(root);
  return out;
}

/** Live processes anywhere on the host whose environment holds `name=value` (sandboxed commands of one run). */
export function processesWithEnv(name: string, value: string): HostProcessInfo[] {
  const needle = `${name}=${value}`;
  const out: HostProcessInfo[] = [];
  for (const pid of pids()) {
    let environ: string;
    try {
      environ = readFileSync(`/proc/${pid}/environ`, 'utf8');
    } catch {
      continue;
    }
    if (!environ.split('\0').includes(needle)) continue;
    const fields = stat(pid);
    if (fields && fields[0] !== 'Z') out.push({ pid, comm: comm(pid), state: fields[0] ?? '?' });
  }
  return out;
}

/** Live processes whose cgroup (any hierarchy) lies under a sandbox cgroup of the server process `serverPid`. */
export function processesInSandboxCgroupsOf(serverPid: number): HostProcessInfo[] {
  const needle = `/rollout-sandboxes/${serverPid}-`;
  const out: HostProcessInfo[] = [];
  for (const pid of pids()) {
    let cgroup: string;
    try {
      cgroup = readFileSync(`/proc/${pid}/cgroup`, 'utf8');
    } catch {
      continue;
    }
    if (!cgroup.includes(needle)) continue;
    const fields = stat(pid);
    if (fields && fields[0] !== 'Z') out.push({ pid, comm: comm(pid), state: fields[0] ?? '?' });
  }
  return out;
}

/** Sandbox cgroup directories (memory and pids hierarchies) owned by the server process `serverPid`. */
export function sandboxCgroupsOf(serverPid: number): string[] {
  const found: string[] = [];
  for (const controller of ['memory', 'pids']) {
    const root = `/sys/fs/cgroup/${controller}/rollout-sandboxes`;
    let owners: string[];
    try {
      owners = readdirSync(root);
    } catch {
      continue;
    }
    for (const owner of owners) if (owner.startsWith(`${serverPid}-`)) found.push(`${root}/${owner}`);
  }
  return found;
}

/**
 * Mount table lines of the image mounts (squashfuse, under `rollout-images-<uid>/<pid>-…`) of the server process
 * `serverPid`. Only its own: other servers on the machine (tests running meanwhile) mount images too.
 */
export function sandboxMountsOf(serverPid: number): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => new RegExp(`/rollout-images-[^/ ]+/${serverPid}-`).test(l));
}
