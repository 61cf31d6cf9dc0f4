import { constants, existsSync } from 'node:fs';
import { access, lstat, mkdir, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';
import { RolloutError, throwIfAborted } from '../errors.js';
import { MAX_TIMER_MS } from '../timers.js';
import { silentLogger, type Logger } from '../observability/logger.js';
import { buildHolderArgv, hostLayout, imageLayout, NAMESPACES, pythonBinds, type Layout, type SandboxIdentity } from './bwrap-command.js';
import { DATA_FD, Holder } from './bwrap-holder.js';
import { limitPtys } from './bwrap-ptys.js';
import { BubblewrapSandbox, newSandboxId } from './bwrap-sandbox.js';
import { createCgroupManager, type CgroupKind, type CgroupManager } from './cgroups.js';
import { resolveHostPython, type HostPython } from './host-python.js';
import { resolveFdCloser, type FdCloser } from './fd-closer.js';
import { resolveSandboxInit } from './init/sandbox-init.js';
import type { ImageMounts, MountedImage } from './images/image-mounts.js';
import { SifImageMounts } from './images/sif-mount.js';
import { defaultNetworkPolicy, isIpv4Cidr, SLIRP_RESOLV_CONF, SlirpNetwork } from './slirp-network.js';
import type { SandboxDriver, SandboxLimits, SandboxSpec } from './types.js';

export { BubblewrapSandbox } from './bwrap-sandbox.js';

export interface BubblewrapDriverOptions {
  logger?: Logger;
  /** The bwrap binary; default `bwrap` from PATH. */
  bwrapPath?: string;
  /** Host Python command whose installation is bound into host-layout sandboxes (default `python3`); false for none. */
  python?: string | false;
  /**
   * Host directory under which the (empty, shared) staging mount point lives (root only); default /run. Every
   * ancestor must be traversable by other users (the sandbox's uid reaches staged paths through it); when it is
   * not, /run is used instead.
   */
  tmpRoot?: string;
  /** `auto` picks `setuid` when the server runs as host root and `userns` otherwise (see SandboxIdentity). */
  identity?: 'auto' | 'userns' | 'setuid';
  /** Host uids handed out to sandboxes in `setuid` mode, one per live sandbox; default 2^24 uids from 0x60000000. */
  uidRange?: { first: number; count: number };
  /** Where images come from; default .sif files (squashfuse, shared mounts) and directories. */
  images?: ImageMounts;
  /** Forces a cgroup mode (see createCgroupManager); default detected. */
  cgroups?: CgroupKind;
  /** How long a sandbox may take to start, ms (default 30 s). */
  startTimeoutMs?: number;
  /**
   * The sandbox init binary (init/sandbox-init.c, built by scripts/setup.sh), run as each sandbox's pid 1; default
   * ROLLOUT_SANDBOX_INIT or `<project>/.cache/bin/rollout-sandbox-init`. `false`, or a missing binary (warned
   * once), runs bwrap's own init and a holder shell instead, which a sandboxed `kill -9 -1` ends.
   */
  init?: string | false;
  /**
   * What a spec's `network: true` gives (config `sandbox.networkMode`). `isolated` (default): the sandbox keeps its own
   * network namespace and slirp4netns (slirp-network.ts) NATs it out with the host's 127.0.0.1 cut off and private
   * destinations (cloud metadata, the LAN, the host's addresses) refused inside the namespace (networkAllow); a missing
   * slirp4netns fails such a sandbox's start (sandbox_error), never falls back to the host's namespace. `host`: the
   * host's own network namespace (no `--unshare-net`): its loopback services, abstract UNIX sockets and whatever it
   * reaches (README, Sandboxes).
   */
  network?: 'isolated' | 'host';
  /** The slirp4netns binary of isolated networking; default `slirp4netns` from PATH. */
  slirp4netnsPath?: string;
  /**
   * IPv4 CIDRs an isolated sandbox may reach although they are private (config `sandbox.networkAllow`): by default the
   * RFC 1918 ranges, link-local (cloud metadata), CGNAT, multicast and the host's own addresses are refused inside the
   * sandbox's namespace (PRIVATE_DESTINATIONS in slirp-network.ts). `0.0.0.0/0` allows everything, and sets no rule
   * (nor needs `ip`).
   */
  networkAllow?: readonly string[];
  /** The iproute2 `ip` binary that sets that policy; default `ip` from PATH. */
  ipPath?: string;
}

/** What isolation this driver achieves on this machine. */
export interface BubblewrapCapabilities {
  /** How memory and process limits hold: per sandbox through cgroup v1/v2, or per process only (`none`). */
  cgroups: CgroupKind;
  identity: SandboxIdentity['kind'];
  /**
   * Whether each sandbox's pid 1 is the sandbox init (the holder itself, out of reach of the sandbox's signals);
   * false when it runs bwrap's init with a holder shell the sandbox's own `kill -9 -1` ends.
   */
  holderIsInit: boolean;
  /**
   * Whether the processes holding a sandbox are exempt from its OOM killer (oom_score_adj -1000: root with
   * CAP_SYS_RESOURCE). False once a write failed (warned once); commands' own raised scores hold either way.
   */
  oomProtection: boolean;
  /**
   * Whether each sandbox's /dev/pts is a devpts instance of at most MAX_PTYS_PER_SANDBOX ptys (bwrap-ptys.ts): needs
   * the sandbox init binary; false once a mount failed (warned once), when a sandbox could take every pty of the host.
   */
  ptyLimit: boolean;
}

interface Probe {
  python: HostPython | undefined;
  init: string | undefined;
  closer: FdCloser;
  host: Layout;
  stageDir: string;
}

/**
 * Long-lived bubblewrap sandboxes. A sandbox is one bwrap process tree — its own user (with further user
 * namespaces disabled), mount, PID, IPC, UTS and network namespaces (`network: true` attaches slirp4netns to the
 * latter, or, with the option `network: 'host'`, shares the host's: see BubblewrapDriverOptions.network) — whose pid 1 is the sandbox
 * init (init/sandbox-init.c), which lives until the server closes its stdin or kills it, reaps orphans, and is the
 * one process the sandbox's own processes cannot signal. The root file system
 * is the image's (each top-level entry read-only) or the host's /usr with a minimal /etc and the host Python; the
 * workspace (spec.workdir) and /tmp are size-limited tmpfs (`--size`, diskMb each), /dev/shm a smaller one, /dev/pts a
 * devpts instance of MAX_PTYS_PER_SANDBOX ptys (bwrap-ptys.ts), and the rest of /dev read-only. Every launch keeps only
 * the descriptors it means to pass (fd-closer.ts).
 *
 * Commands, spawned processes and file operations enter the running sandbox with nsenter (namespaces and root
 * held open as descriptors since start, so a reused pid cannot redirect them; a server that is not root joins the user
 * namespace owning them first: see enterOwnerArgv in bwrap-command.ts), as uid 1000, no_new_privs, no
 * capabilities. Why nsenter rather than an agent process inside: nothing has to be shipped into (or be runnable
 * in) every image but /bin/sh; each command is a host child we can time out, cap and kill; the cost is ~5 small
 * execs per command (see the README for measured figures).
 *
 * Whole-sandbox limits: memory (processes plus tmpfs pages) and process count through cgroups (v1 as root, or
 * delegated v2), each command in a child cgroup so a timeout kills what it started, setsid()ed or not. Without
 * writable cgroups (rootless, no delegation) RLIMIT_AS and RLIMIT_NPROC per process are all that holds, and the
 * driver warns once; `capabilities` says which. RLIMIT_FSIZE (maxFileMb) and RLIMIT_CORE=0 per process always.
 *
 * @example
 * const driver = new BubblewrapDriver({ logger });
 * await driver.reap();
 * const sandbox = await driver.start(spec, signal);
 * try { console.log((await sandbox.exec(['python3', '-c', 'print(1 + 1)'])).stdout); } finally { await sandbox.stop(); }
 */
export class BubblewrapDriver implements SandboxDriver {
  readonly name = 'bwrap';
  readonly capabilities: BubblewrapCapabilities;
  private readonly log: Logger;
  private readonly bwrapPath: string;
  private readonly identityMode: 'userns' | 'setuid';
  private readonly uidRange: { first: number; count: number };
  private readonly uidsInUse = new Set<number>();
  private readonly images: ImageMounts;
  private readonly cgroups: CgroupManager;
  private readonly networkMode: 'isolated' | 'host';
  private readonly slirpPath: string;
  private readonly networkAllow: readonly string[];
  private probe: Promise<Probe> | undefined;

  constructor(private readonly options: BubblewrapDriverOptions = {}) {
    this.log = (options.logger ?? silentLogger()).child({ component: 'sandbox' });
    this.bwrapPath = options.bwrapPath ?? 'bwrap';
    this.networkMode = options.network ?? 'isolated';
    this.slirpPath = options.slirp4netnsPath ?? 'slirp4netns';
    this.networkAllow = [...(options.networkAllow ?? [])];
    for (const cidr of this.networkAllow) {
      if (!isIpv4Cidr(cidr)) throw RolloutError.invalid('sandbox.networkAllow', `must hold IPv4 CIDRs such as 10.1.0.0/16, got ${JSON.stringify(cidr)}`);
    }
    const mode = options.identity ?? 'auto';
    const root = isRoot();
    if (mode === 'setuid' && !root) throw new RolloutError('failed_precondition', "bwrap identity 'setuid' needs the server to run as root");
    this.identityMode = mode === 'auto' ? (root ? 'setuid' : 'userns') : mode;
    this.uidRange = options.uidRange ?? { first: 0x6000_0000, count: 1 << 24 };
    this.images = options.images ?? new SifImageMounts({ logger: this.log });
    this.cgroups = createCgroupManager({ logger: this.log, ...(options.cgroups !== undefined && { kind: options.cgroups }) });
    this.capabilities = { cgroups: this.cgroups.kind, identity: this.identityMode, oomProtection: root, holderIsInit: false, ptyLimit: false };
  }

  async start(spec: SandboxSpec, signal?: AbortSignal): Promise<BubblewrapSandbox> {
    validateSpec(spec);
    throwIfAborted(signal);
    const probe = await this.ensureProbe();
    const isolatedNetwork = spec.network && this.networkMode === 'isolated';
    if (isolatedNetwork && !(await executable(this.slirpPath))) {
      throw new RolloutError(
        'sandbox_error',
        `the sandbox asks for network, which sandbox.networkMode 'isolated' gives through slirp4netns, and ${this.slirpPath} cannot be run (not found or not executable): scripts/setup.sh installs it (apt package slirp4netns)`,
      );
    }
    throwIfAborted(signal);
    const id = newSandboxId();
    const undo: Array<() => Promise<void>> = [];
    const rollback = async (): Promise<void> => {
      for (const step of undo.reverse()) await step().catch((err: unknown) => this.log.error({ err, sandbox: id }, 'start rollback failed'));
    };
    try {
      let image: MountedImage | undefined;
      let layout: Layout = { ...probe.host, binds: [...probe.host.binds, ...(probe.python ? pythonBinds(probe.python) : [])] };
      if (spec.image !== undefined) {
        image = await this.images.acquire(spec.image, signal);
        undo.push(() => image!.release());
        layout = imageLayout(image.root);
      }
      const identity = this.allocateIdentity();
      undo.push(async () => this.releaseIdentity(identity));
      const cgroup = await this.cgroups.create(id, spec.limits);
      undo.push(() => cgroup.remove());
      throwIfAborted(signal);
      // The isolated network's DNS forwarder as /etc/resolv.conf: over the host's (host layout), or over an image's own
      // regular file (a read-only /etc cannot take a new mount point; a symlink would be followed out of /etc).
      const resolvConf = isolatedNetwork && (image === undefined || (await isRegularFile(join(image.root, 'etc', 'resolv.conf'))));
      const argv = buildHolderArgv({
        bwrapPath: this.bwrapPath, identity, limits: spec.limits, network: spec.network && this.networkMode === 'host', layout,
        ...(resolvConf && { resolvConfFd: DATA_FD }),
        mounts: spec.mounts.map((m) => ({ source: m.source, dest: m.target, readOnly: m.readOnly ?? true })),
        workdir: spec.workdir, cgroupProcs: cgroup.procs, stageDir: probe.stageDir, infoFd: 4,
        ...(probe.init !== undefined && { init: probe.init }),
      });
      const holder = await Holder.start(argv, {
        lowerOomScore: this.capabilities.oomProtection,
        onOomScoreError: (err) => this.oomScoreFailed(err),
        timeoutMs: this.options.startTimeoutMs ?? 30_000,
        holderIsInit: probe.init !== undefined,
        closer: probe.closer,
        // Not root: commands must join the user namespace that owns the sandbox's namespaces (bwrap-holder.ts, holdOwner).
        ...(!isRoot() && { ownerPython: probe.python?.executable ?? 'python3' }),
        ...(resolvConf && { data: SLIRP_RESOLV_CONF }),
        ...(signal !== undefined && { signal }),
      });
      undo.push(async () => holder.kill());
      let network: SlirpNetwork | undefined;
      if (isolatedNetwork) {
        const held = (file: (typeof NAMESPACES)[number]['file']): number => holder.namespaces.fds[NAMESPACES.findIndex((ns) => ns.file === file)]!;
        // The network namespace belongs to the owner of the holder's nested user namespace, when there is one.
        const net = await SlirpNetwork.start({
          slirpPath: this.slirpPath, netnsFd: held('net'), usernsFd: holder.namespaces.owner ?? held('user'), enterUserns: !isRoot(), closer: probe.closer,
          timeoutMs: this.options.startTimeoutMs ?? 30_000, ...(signal !== undefined && { signal }),
          // The host's addresses as they are now (they may change while the server runs).
          policy: defaultNetworkPolicy(this.networkAllow), ...(this.options.ipPath !== undefined && { ipPath: this.options.ipPath }),
        });
        network = net;
        undo.push(async () => net.kill());
        // A sandbox that dies on its own loses its network at once, not at its stop().
        void holder.exited.then(() => net.kill());
      }
      if (this.capabilities.ptyLimit) {
        const failed = await limitPtys(holder, { identity, closer: probe.closer });
        if (failed !== undefined) this.ptyLimitFailed(failed);
      }
      const sandbox = new BubblewrapSandbox({
        id, spec, holder, cgroup, cgroups: this.cgroups.kind !== 'none', identity, python: spec.image === undefined ? probe.python : undefined,
        closer: probe.closer, hasInit: probe.init !== undefined, logger: this.log, ...(network !== undefined && { network }),
        onStopped: async () => {
          this.releaseIdentity(identity);
          await image?.release();
        },
      });
      this.log.debug(
        { sandbox: id, image: spec.image ?? 'host', cgroups: this.cgroups.kind, limits: spec.limits, network: spec.network ? this.networkMode : 'none', slirpPid: network?.pid },
        'sandbox started',
      );
      return sandbox;
    } catch (err) {
      await rollback();
      throw err instanceof RolloutError ? err : RolloutError.from(err, 'sandbox_error');
    }
  }

  /**
   * Removes what a crashed predecessor left: its cgroups (after killing every process in them — processes in
   * cgroups under our parent are provably ours) and, through ImageMounts.reap, its image mounts. Sandboxes keep no
   * host directories (their workspaces are tmpfs inside their own mount namespace), so there are none to remove.
   */
  async reap(): Promise<{ removed: number }> {
    const cgroups = await this.cgroups.reap();
    const images = await this.images.reap();
    if (cgroups.removed + images.removed > 0) this.log.info({ sandboxes: cgroups.removed, images: images.removed }, 'reaped leftovers of a previous server');
    return { removed: cgroups.removed + images.removed };
  }

  /** Unmounts the images kept warm for new sandboxes (their sandboxes must have stopped). */
  async close(): Promise<void> {
    await this.images.close?.();
  }

  private ensureProbe(): Promise<Probe> {
    this.probe ??= this.runProbe().catch((err: unknown) => {
      this.probe = undefined; // a transient failure must not poison the driver for good
      throw err;
    });
    return this.probe;
  }

  private async runProbe(): Promise<Probe> {
    if (!(await executable(this.bwrapPath))) throw new RolloutError('sandbox_error', `cannot run ${this.bwrapPath}: ENOENT (not found or not executable)`);
    const python = this.options.python === false ? undefined : await resolveHostPython(this.options.python || 'python3');
    if (!python && this.options.python !== false) this.log.warn('no host python3 found; host-layout sandboxes will have no Python unless /usr has one');
    const base = this.options.tmpRoot !== undefined && (await traversableByAll(this.options.tmpRoot)) ? this.options.tmpRoot : existsSync('/run') ? '/run' : tmpdir();
    const stageDir = join(base, 'rollout-bwrap-stage');
    if (this.identityMode === 'setuid') {
      await mkdir(stageDir, { recursive: true, mode: 0o755 });
      const st = await lstat(stageDir);
      if (!st.isDirectory() || st.uid !== 0) throw new RolloutError('sandbox_error', `${stageDir} is not a directory owned by root`);
    }
    const init = await resolveSandboxInit(this.options.init);
    this.capabilities.holderIsInit = init.path !== undefined;
    this.capabilities.ptyLimit = init.path !== undefined;
    if (init.path === undefined && init.tried !== 'disabled') {
      this.log.warn(
        { tried: init.tried },
        "no sandbox init binary (scripts/setup.sh builds it): sandboxes run bwrap's init and a holder shell, and a sandboxed `kill -9 -1` ends its sandbox (sandbox_error)",
      );
    }
    const closer = resolveFdCloser(init.path);
    if (closer.kind === 'none') {
      this.log.warn("neither the sandbox init binary nor bash is on this host: descriptors the server inherited without close-on-exec reach every sandboxed process");
    }
    this.log.info({ identity: this.identityMode, cgroups: this.cgroups.kind, python: python?.executable ?? null, init: init.path ?? null, fdCloser: closer.kind }, 'bubblewrap sandboxes available');
    return { python, init: init.path, closer, host: hostLayout(), stageDir };
  }

  /** A sandbox's pty limit could not be mounted: said once, then not tried again (capabilities tell). */
  private ptyLimitFailed(why: string): void {
    if (!this.capabilities.ptyLimit) return;
    this.capabilities.ptyLimit = false;
    this.log.warn({ why }, 'cannot limit the ptys of a sandbox (devpts max): from now on one sandbox can take every pty other sandboxes of this host would get');
  }

  /** A holder's oom_score_adj could not be lowered: said once, then not tried again (capabilities tell). */
  private oomScoreFailed(err: unknown): void {
    if (!this.capabilities.oomProtection) return;
    this.capabilities.oomProtection = false;
    this.log.warn(
      { err: (err as Error).message },
      'cannot exempt sandbox holders from the OOM killer (oom_score_adj -1000; needs CAP_SYS_RESOURCE): they rely on the raised scores of sandbox commands and on the tmpfs cap below the memory limit',
    );
  }

  private allocateIdentity(): SandboxIdentity {
    if (this.identityMode === 'userns') return { kind: 'userns' };
    const { first, count } = this.uidRange;
    if (this.uidsInUse.size >= count) throw new RolloutError('resource_exhausted', 'no free sandbox uid');
    let uid: number;
    do uid = first + Math.floor(Math.random() * count);
    while (this.uidsInUse.has(uid));
    this.uidsInUse.add(uid);
    return { kind: 'setuid', uid, gid: uid };
  }

  private releaseIdentity(identity: SandboxIdentity): void {
    if (identity.kind === 'setuid') this.uidsInUse.delete(identity.uid);
  }
}

function isRoot(): boolean {
  return process.getuid?.() === 0;
}

/** Whether `command` (a path, or a name looked up on PATH) is an executable file. */
async function executable(command: string): Promise<boolean> {
  const candidates = command.includes('/') ? [command] : (process.env.PATH ?? '/usr/bin:/bin').split(':').map((d) => join(d, command));
  for (const c of candidates) if (await access(c, constants.X_OK).then(() => true, () => false)) return true;
  return false;
}

async function isRegularFile(path: string): Promise<boolean> {
  return (await lstat(path).catch(() => undefined))?.isFile() ?? false;
}

/** Whether every directory from / down to `dir` lets other users through (o+x). */
async function traversableByAll(dir: string): Promise<boolean> {
  for (let d = posix.resolve(dir); ; d = posix.dirname(d)) {
    const st = await stat(d).catch(() => undefined);
    if (!st || (st.mode & 0o001) === 0) return false;
    if (d === '/') return true;
  }
}

function validateSpec(spec: SandboxSpec): void {
  const limits: SandboxLimits = spec.limits;
  for (const key of ['memoryMb', 'maxProcesses', 'diskMb', 'wallClockMs', 'commandTimeoutMs', 'outputLimitBytes', 'maxFileMb'] as const) {
    const value = limits[key];
    if (!Number.isInteger(value) || value <= 0) throw RolloutError.invalid(`limits.${key}`, `must be a positive integer, got ${value}`);
  }
  for (const key of ['wallClockMs', 'commandTimeoutMs'] as const) {
    if (limits[key] > MAX_TIMER_MS) throw RolloutError.invalid(`limits.${key}`, `at most ${MAX_TIMER_MS} (what a timer holds), got ${limits[key]}`);
  }
  if (!posix.isAbsolute(spec.workdir) || posix.normalize(spec.workdir) === '/') throw RolloutError.invalid('workdir', `must be an absolute path below /, got ${spec.workdir}`);
  for (const m of spec.mounts) {
    if (!posix.isAbsolute(m.source) || !posix.isAbsolute(m.target)) throw RolloutError.invalid('mounts', `${m.source} → ${m.target}: both paths must be absolute`);
  }
}
