import { chmod, chown, mkdtemp, realpath } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RolloutError, throwIfAborted } from '../errors.js';
import { silentLogger, type Logger } from '../observability/logger.js';
import { buildExecArgs, systemLayoutArgs, type SandboxIdentity } from './bwrap-command.js';
import { BubblewrapSandbox } from './bwrap-sandbox.js';
import { spawnContained } from './contained-process.js';
import { resolveHostPython, type HostPython } from './host-python.js';
import { removeTree } from './remove-tree.js';
import type { SandboxDriver, SandboxLimits, SandboxSpec } from './types.js';

export { BubblewrapSandbox } from './bwrap-sandbox.js';

export interface BubblewrapDriverOptions {
  logger?: Logger;
  /** The bwrap binary; default `bwrap` from PATH. */
  bwrapPath?: string;
  /** Host Python command whose installation is bound into sandboxes (default `python3`); false for none. */
  python?: string | false;
  /** Host directory under which work dirs are created; default the OS temp dir. */
  tmpRoot?: string;
  /** Path of the work dir inside the sandbox; default /work. */
  workdir?: string;
  /**
   * How RLIMIT_NPROC is made to hold (see SandboxIdentity): `auto` picks `setuid` when the server runs as
   * host root and `userns` otherwise.
   */
  identity?: 'auto' | 'userns' | 'setuid';
  /** Host uids handed out to sandboxes in `setuid` mode, one per live sandbox; default 2^24 uids from 0x60000000. */
  uidRange?: { first: number; count: number };
}

interface Probe {
  python: HostPython | undefined;
  layout: string[];
}

/**
 * Rootless sandboxes on bubblewrap: each exec runs in fresh namespaces (mount, PID, IPC, UTS, network unless
 * asked) with the host's /usr read-only, a minimal /etc, the host Python installation read-only, a private
 * /tmp, and the sandbox's work dir (a host temp dir) read-write at /work. Limits: RLIMIT_AS and RLIMIT_NPROC set
 * by prlimit inside the sandbox, output capped per stream, a per-call timeout bounded by the sandbox's
 * wall-clock budget. Why bwrap: it needs no daemon and no root, which is what Slurm clusters give us.
 *
 * Processes do not outlive their exec: the exec's PID namespace dies with it. Files in the work dir persist
 * across execs until `stop()`; /tmp does not.
 *
 * @example
 * const driver = new BubblewrapDriver({ logger });
 * const sandbox = await driver.start({ network: false, memoryMb: 512, maxProcesses: 32, wallClockMs: 60_000, outputLimitBytes: 16_384 });
 * try { console.log((await sandbox.exec(['python3', '-c', 'print(1 + 1)'])).stdout); } finally { await sandbox.stop(); }
 */
export class BubblewrapDriver implements SandboxDriver {
  readonly name = 'bwrap';
  private readonly log: Logger;
  private readonly bwrapPath: string;
  private readonly identityMode: 'userns' | 'setuid';
  private readonly uidRange: { first: number; count: number };
  private readonly uidsInUse = new Set<number>();
  private probe: Promise<Probe> | undefined;

  constructor(private readonly options: BubblewrapDriverOptions = {}) {
    this.log = (options.logger ?? silentLogger()).child({ component: 'sandbox' });
    this.bwrapPath = options.bwrapPath ?? 'bwrap';
    const mode = options.identity ?? 'auto';
    const isRoot = process.getuid?.() === 0;
    if (mode === 'setuid' && !isRoot) throw new RolloutError('failed_precondition', "bwrap identity 'setuid' needs the server to run as root");
    this.identityMode = mode === 'auto' ? (isRoot ? 'setuid' : 'userns') : mode;
    this.uidRange = options.uidRange ?? { first: 0x6000_0000, count: 1 << 24 };
  }

  async start(spec: SandboxSpec, signal?: AbortSignal): Promise<BubblewrapSandbox> {
    const { limits } = spec;
    validateLimits(limits);
    if (spec.image !== undefined || spec.mounts.length > 0) {
      throw new RolloutError('sandbox_error', 'this bubblewrap driver runs the host layout only: images and mounts are not supported yet');
    }
    throwIfAborted(signal);
    const probe = await this.ensureProbe();
    throwIfAborted(signal);
    const identity = this.allocateIdentity();
    let hostWorkdir: string | undefined;
    try {
      hostWorkdir = await this.makeWorkdir(identity);
      throwIfAborted(signal);
    } catch (err) {
      this.releaseIdentity(identity);
      if (hostWorkdir !== undefined) await removeTree(hostWorkdir);
      throw err instanceof RolloutError ? err : RolloutError.from(err, 'sandbox_error');
    }
    const sandbox = new BubblewrapSandbox({
      spec,
      network: spec.network,
      bwrapPath: this.bwrapPath,
      systemLayout: probe.layout,
      python: probe.python,
      identity,
      limits,
      hostWorkdir,
      workdir: spec.workdir,
      logger: this.log,
      onStopped: () => this.releaseIdentity(identity),
    });
    this.log.debug({ sandbox: sandbox.id, hostWorkdir, identity: identity.kind, limits }, 'sandbox started');
    return sandbox;
  }

  /** Runs `true` in a full sandbox once per driver, so a broken bwrap fails `start` with bwrap's own words. */
  private ensureProbe(): Promise<Probe> {
    this.probe ??= this.runProbe().catch((err: unknown) => {
      this.probe = undefined; // a transient failure (EAGAIN, a full disk) must not poison the driver for good
      throw err;
    });
    return this.probe;
  }

  private async runProbe(): Promise<Probe> {
    const python = this.options.python === false ? undefined : await resolveHostPython(this.options.python || 'python3');
    if (!python && this.options.python !== false) this.log.warn('no host python3 found; sandboxes will have no Python unless /usr has one');
    const layout = systemLayoutArgs();
    const identity = this.allocateIdentity();
    const hostWorkdir = await this.makeWorkdir(identity).catch((err: unknown) => {
      this.releaseIdentity(identity);
      throw RolloutError.from(err, 'sandbox_error');
    });
    try {
      const limits: SandboxLimits = { memoryMb: 256, maxProcesses: 16, diskMb: 16, wallClockMs: 30_000, commandTimeoutMs: 30_000, outputLimitBytes: 4096, maxFileMb: 16 };
      const args = buildExecArgs({
        bwrapPath: this.bwrapPath, systemLayout: layout, python, identity, limits, network: false, hostWorkdir,
        workdir: this.options.workdir ?? '/work', cwd: this.options.workdir ?? '/work', env: {}, argv: ['true'],
      });
      const result = await spawnContained(this.bwrapPath, args, { timeoutMs: 30_000, outputLimitBytes: 4096 }).result;
      if (result.spawnError) throw new RolloutError('sandbox_error', `cannot run ${this.bwrapPath}: ${result.spawnError.message}`);
      if (!result.started || result.exitCode !== 0) {
        const why = result.timedOut ? 'timed out' : `exit code ${result.exitCode ?? result.signal}`;
        throw new RolloutError('sandbox_error', `bubblewrap does not work on this host (${why}): ${result.stderr.trim()}`);
      }
      this.log.info({ identity: this.identityMode, python: python?.executable ?? null }, 'bubblewrap sandboxes available');
      return { python, layout };
    } finally {
      this.releaseIdentity(identity);
      await removeTree(hostWorkdir);
    }
  }

  private async makeWorkdir(identity: SandboxIdentity): Promise<string> {
    const dir = await realpath(await mkdtemp(join(this.options.tmpRoot ?? tmpdir(), 'rollout-sbx-')));
    await chmod(dir, 0o700);
    if (identity.kind === 'setuid') await chown(dir, identity.uid, identity.gid);
    return dir;
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

function validateLimits(limits: SandboxLimits): void {
  for (const key of ['memoryMb', 'maxProcesses', 'diskMb', 'wallClockMs', 'commandTimeoutMs', 'outputLimitBytes', 'maxFileMb'] as const) {
    const value = limits[key];
    if (!Number.isInteger(value) || value <= 0) throw RolloutError.invalid(`limits.${key}`, `must be a positive integer, got ${value}`);
  }
}
