import { accessSync, constants, existsSync, mkdirSync, readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import { CgroupTree, ownerIsAlive, processStartTime } from './cgroup-tree.js';

/** Which whole-sandbox limits the kernel enforces: cgroup v1 or v2 controllers, or only per-process rlimits. */
export type CgroupKind = 'v1' | 'v2' | 'none';

/** The cgroups of one command (exec or spawn): joined by its launcher, killed as a whole on timeout or abort. */
export interface CommandCgroup {
  /** `cgroup.procs` files the command's launcher writes its own pid to before it enters the sandbox. */
  readonly procs: readonly string[];
  /** SIGKILLs every process of the command, setsid()ed and double-forked ones included; resolves when none is left. */
  kill(): Promise<void>;
  /** Removes the command's cgroup if it is empty (it stays until the sandbox's removal otherwise). */
  release(): Promise<void>;
}

/** The cgroups of one sandbox: the memory and pids limits of all its processes (and of its tmpfs pages). */
export interface SandboxCgroup {
  /** `cgroup.procs` files the sandbox's init chain joins before bwrap starts. */
  readonly procs: readonly string[];
  /** Synchronous (one mkdir), so `Sandbox.spawn` can stay synchronous. */
  command(): CommandCgroup;
  /** Highest memory use seen (v1 max_usage_in_bytes, v2 memory.peak), bytes; undefined when the kernel cannot say. */
  peakMemoryBytes(): Promise<number | undefined>;
  /**
   * Where the sandbox stands against its own limits right now, read synchronously (a few small cgroup files: the
   * answer must be there before the sandbox's stop removes them); undefined without cgroups or when unreadable.
   */
  usage(): CgroupUsage | undefined;
  /** Kills every process in the sandbox's cgroups, waits until they are gone, and removes the cgroups. Idempotent. */
  remove(): Promise<void>;
}

/** What a sandbox's cgroups say of its own limits (see SandboxCgroup.usage). Counts are since its start. */
export interface CgroupUsage {
  /**
   * Processes and threads of the whole sandbox and its limit (pids.max, INFRA_PROCESSES included). Why no count
   * of refused forks: v1 records pids.events in the forking task's own (command) cgroup, not the limiting one.
   */
  pids?: { current: number; max: number };
  /** Memory of the whole sandbox (processes and tmpfs pages), its limit, times it hit it, and OOM kills in it. */
  memory?: { usageBytes: number; limitBytes: number; failures: number; oomKills: number };
}

/**
 * Creates per-sandbox cgroups under a parent this server owns. Invariant: every cgroup it creates lies under
 * `<parent>/<owner>`, where owner names this server process (pid and start time); a process found in such a
 * cgroup was put there by a launcher of this server (or its crashed predecessor), so killing it is safe.
 */
export interface CgroupManager {
  readonly kind: CgroupKind;
  create(id: string, limits: { memoryMb: number; maxProcesses: number }): Promise<SandboxCgroup>;
  /** Kills and removes the cgroups of owners that are no longer running; returns how many sandboxes it removed. */
  reap(): Promise<{ removed: number }>;
}

/** Extra pids a sandbox needs besides the user's: bwrap's monitor and init, and the holder. */
export const INFRA_PROCESSES = 3;
const PARENT = 'rollout-sandboxes';
const V1_ROOT = '/sys/fs/cgroup';

export interface CgroupOptions {
  logger: Logger;
  /** Forces a kind (tests, or an operator who knows better); default detected. */
  kind?: CgroupKind;
  /** Root of the cgroup file system; default /sys/fs/cgroup. */
  root?: string;
}

/**
 * Picks the best cgroup mode this process may use:
 * - `v1`: the memory and pids controllers are mounted as v1 hierarchies and writable (the server runs as root);
 *   cgroups go under `/sys/fs/cgroup/{memory,pids}/rollout-sandboxes/<owner>/<sandbox>`. Memory covers the
 *   sandbox's tmpfs pages (charged to the cgroup of the process that wrote them) and swap (memsw) when present.
 * - `v2`: a unified hierarchy where this process's own cgroup is writable (delegated, e.g. a systemd unit with
 *   Delegate=yes) and offers memory and pids; sandboxes go under `<own>/rollout-sandboxes/<owner>/<sandbox>`.
 * - `none`: neither. Memory and processes are then limited per process (RLIMIT_AS, RLIMIT_NPROC) only, so a
 *   sandbox may use about maxProcesses × memoryMb plus its tmpfs; a warning says so once.
 */
export function createCgroupManager(options: CgroupOptions): CgroupManager {
  const log = options.logger.child({ component: 'cgroups' });
  const root = options.root ?? V1_ROOT;
  const kind = options.kind ?? detectKind(root);
  const owner = `${process.pid}-${processStartTime(process.pid) ?? 'unknown'}`;
  if (kind === 'v1') return new V1Manager(root, owner, log);
  if (kind === 'v2') return new V2Manager(join(root, ownCgroupV2() ?? ''), owner, log);
  log.warn('no writable cgroups (not root on cgroup v1, no delegated cgroup v2): sandbox memory and process limits hold per process only (RLIMIT_AS, RLIMIT_NPROC), not for the sandbox as a whole');
  return { kind: 'none', create: () => Promise.resolve(NO_CGROUP), reap: () => Promise.resolve({ removed: 0 }) };
}

function detectKind(root: string): CgroupKind {
  if (['memory', 'pids'].every((c) => writable(join(root, c)))) return 'v1';
  const own = ownCgroupV2();
  if (own === undefined) return 'none';
  const controllers = readText(join(root, own, 'cgroup.controllers'))?.split(/\s+/) ?? [];
  return controllers.includes('memory') && controllers.includes('pids') && writable(join(root, own)) ? 'v2' : 'none';
}

function ownCgroupV2(): string | undefined {
  const line = readText('/proc/self/cgroup')?.split('\n').find((l) => l.startsWith('0::'));
  return line?.slice(3);
}

function writable(path: string): boolean {
  try {
    accessSync(path, constants.W_OK);
    return existsSync(join(path, 'cgroup.procs'));
  } catch {
    return false;
  }
}

function readText(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
}

const NO_COMMAND: CommandCgroup = { procs: [], kill: () => Promise.resolve(), release: () => Promise.resolve() };
const NO_CGROUP: SandboxCgroup = {
  procs: [],
  command: () => NO_COMMAND,
  peakMemoryBytes: () => Promise.resolve(undefined),
  usage: () => undefined,
  remove: () => Promise.resolve(),
};

/**
 * cgroup v1: memory limits at `memory/<parent>/<owner>/<id>` (all the sandbox's processes), process count and
 * per-command trees at `pids/.../<id>` (init) and `pids/.../<id>/c<n>` (each command; hierarchical, so pids.max of
 * the sandbox counts them all).
 */
class V1Manager implements CgroupManager {
  readonly kind = 'v1';
  constructor(private readonly root: string, private readonly owner: string, private readonly log: Logger) {}

  async create(id: string, limits: { memoryMb: number; maxProcesses: number }): Promise<SandboxCgroup> {
    const memory = new CgroupTree(join(this.root, 'memory', PARENT, this.owner, id));
    const pids = new CgroupTree(join(this.root, 'pids', PARENT, this.owner, id));
    try {
      await memory.make();
      const bytes = String(limits.memoryMb * 1024 * 1024);
      await writeFile(join(memory.path, 'memory.limit_in_bytes'), bytes);
      if (existsSync(join(memory.path, 'memory.memsw.limit_in_bytes'))) await writeFile(join(memory.path, 'memory.memsw.limit_in_bytes'), bytes);
      await pids.make();
      await writeFile(join(pids.path, 'pids.max'), String(limits.maxProcesses + INFRA_PROCESSES));
    } catch (err) {
      await Promise.all([memory.remove(), pids.remove()]);
      throw new RolloutError('sandbox_error', `cannot create the cgroups of sandbox ${id}`, { cause: err });
    }
    let n = 0;
    return {
      procs: [memory.procs, pids.procs],
      command: () => {
        const cmd = new CgroupTree(join(pids.path, `c${n++}`));
        mkdirSync(cmd.path);
        return { procs: [memory.procs, cmd.procs], kill: () => cmd.kill(), release: () => cmd.removeIfEmpty() };
      },
      peakMemoryBytes: async () => Number(await readFile(join(memory.path, 'memory.max_usage_in_bytes'), 'utf8')),
      usage: () => readUsage({
        pidsCurrent: join(pids.path, 'pids.current'), pidsMax: join(pids.path, 'pids.max'),
        memoryUsage: join(memory.path, 'memory.usage_in_bytes'), memoryLimit: join(memory.path, 'memory.limit_in_bytes'),
        memoryFailures: { file: join(memory.path, 'memory.failcnt') }, memoryOomKills: { file: join(memory.path, 'memory.oom_control'), key: 'oom_kill' },
      }),
      remove: async () => {
        const gone = (await pids.remove()) && (await memory.remove());
        if (!gone) throw new Error(`cgroups of sandbox ${id} are still busy after their processes were killed`);
        // The owner dir goes with its last sandbox (a concurrent create re-makes it: see CgroupTree.make).
        for (const c of ['memory', 'pids']) await rmdir(join(this.root, c, PARENT, this.owner)).catch(() => undefined);
      },
    };
  }

  async reap(): Promise<{ removed: number }> {
    let removed = 0;
    for (const controller of ['pids', 'memory']) {
      const parent = join(this.root, controller, PARENT);
      removed += await reapOwners(parent, this.log, controller === 'pids');
    }
    return { removed };
  }
}

/**
 * cgroup v2 with delegation: `<own>/rollout-sandboxes/<owner>/<id>/{init,c<n>}` (v2 forbids processes in inner
 * nodes, hence the init leaf). Enabling controllers for children needs the server out of its own cgroup: it moves
 * itself into `<own>/rollout-server` once, as container runtimes do. Untested on this project's CI (cgroup v1 there).
 */
class V2Manager implements CgroupManager {
  readonly kind = 'v2';
  private ready: Promise<void> | undefined;
  constructor(private readonly own: string, private readonly owner: string, private readonly log: Logger) {}

  private prepare(): Promise<void> {
    this.ready ??= (async () => {
      const enable = (dir: string): Promise<void> => writeFile(join(dir, 'cgroup.subtree_control'), '+memory +pids');
      await enable(this.own).catch(async () => {
        const leaf = join(this.own, 'rollout-server');
        await mkdir(leaf, { recursive: true });
        for (const pid of (await readFile(join(this.own, 'cgroup.procs'), 'utf8')).split('\n').filter(Boolean)) {
          await writeFile(join(leaf, 'cgroup.procs'), pid).catch(() => undefined);
        }
        await enable(this.own);
      });
      for (const dir of [join(this.own, PARENT), join(this.own, PARENT, this.owner)]) {
        await mkdir(dir, { recursive: true });
        await enable(dir);
      }
    })();
    return this.ready;
  }

  async create(id: string, limits: { memoryMb: number; maxProcesses: number }): Promise<SandboxCgroup> {
    const top = new CgroupTree(join(this.own, PARENT, this.owner, id));
    try {
      await this.prepare();
      await top.make();
      await writeFile(join(top.path, 'memory.max'), String(limits.memoryMb * 1024 * 1024));
      await writeFile(join(top.path, 'memory.swap.max'), '0').catch(() => undefined);
      await writeFile(join(top.path, 'pids.max'), String(limits.maxProcesses + INFRA_PROCESSES));
      await writeFile(join(top.path, 'cgroup.subtree_control'), '+memory +pids');
      await mkdir(join(top.path, 'init'));
    } catch (err) {
      await top.remove();
      throw new RolloutError('sandbox_error', `cannot create the cgroups of sandbox ${id}`, { cause: err });
    }
    let n = 0;
    return {
      procs: [join(top.path, 'init', 'cgroup.procs')],
      command: () => {
        const cmd = new CgroupTree(join(top.path, `c${n++}`));
        mkdirSync(cmd.path);
        return { procs: [cmd.procs], kill: () => cmd.kill(), release: () => cmd.removeIfEmpty() };
      },
      peakMemoryBytes: async () => {
        const text = await readFile(join(top.path, 'memory.peak'), 'utf8').catch(() => undefined);
        return text === undefined ? undefined : Number(text);
      },
      usage: () => readUsage({
        pidsCurrent: join(top.path, 'pids.current'), pidsMax: join(top.path, 'pids.max'),
        memoryUsage: join(top.path, 'memory.current'), memoryLimit: join(top.path, 'memory.max'),
        memoryFailures: { file: join(top.path, 'memory.events'), key: 'max' }, memoryOomKills: { file: join(top.path, 'memory.events'), key: 'oom_kill' },
      }),
      remove: async () => {
        if (!(await top.remove())) throw new Error(`cgroups of sandbox ${id} are still busy after their processes were killed`);
      },
    };
  }

  async reap(): Promise<{ removed: number }> {
    return { removed: await reapOwners(join(this.own, PARENT), this.log, true) };
  }
}

interface UsageFiles {
  pidsCurrent: string;
  pidsMax: string;
  memoryUsage: string;
  memoryLimit: string;
  /** A plain counter (`key` absent) or a `key N` line of a flat-keyed file. */
  memoryFailures: { file: string; key?: string };
  memoryOomKills: { file: string; key?: string };
}

function readUsage(files: UsageFiles): CgroupUsage | undefined {
  const num = (text: string | undefined): number | undefined => {
    const n = text === undefined ? NaN : Number(text.trim());
    return Number.isFinite(n) ? n : undefined;
  };
  const counter = (c: { file: string; key?: string }): number => {
    const text = readText(c.file);
    if (c.key === undefined) return num(text) ?? 0;
    const line = text?.split('\n').find((l) => l.startsWith(`${c.key} `));
    return num(line?.slice(c.key.length + 1)) ?? 0;
  };
  const usage: CgroupUsage = {};
  const current = num(readText(files.pidsCurrent));
  const max = num(readText(files.pidsMax)); // 'max' (no limit) reads as undefined
  if (current !== undefined && max !== undefined) usage.pids = { current, max };
  const usageBytes = num(readText(files.memoryUsage));
  const limitBytes = num(readText(files.memoryLimit));
  if (usageBytes !== undefined && limitBytes !== undefined) {
    usage.memory = { usageBytes, limitBytes, failures: counter(files.memoryFailures), oomKills: counter(files.memoryOomKills) };
  }
  return usage.pids || usage.memory ? usage : undefined;
}

/** Removes `<parent>/<owner>` trees whose owner process is gone; counts the sandboxes in them when `count`. */
async function reapOwners(parent: string, log: Logger, count: boolean): Promise<number> {
  let removed = 0;
  const owners = await readdir(parent, { withFileTypes: true }).catch(() => []);
  for (const entry of owners) {
    if (!entry.isDirectory() || ownerIsAlive(entry.name)) continue;
    const dir = join(parent, entry.name);
    const sandboxes = (await readdir(dir, { withFileTypes: true }).catch(() => [])).filter((e) => e.isDirectory());
    if (count) removed += sandboxes.length;
    await new CgroupTree(dir).remove();
    log.info({ cgroup: dir, sandboxes: sandboxes.length }, 'reaped the cgroups of a crashed predecessor');
  }
  // Give a just-killed tree's processes a moment to leave before the next controller's pass.
  if (removed > 0) await sleep(10);
  return removed;
}
