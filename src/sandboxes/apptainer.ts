import { chmod, mkdir, mkdtemp, readdir, realpath, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RolloutError, throwIfAborted } from '../errors.js';
import { silentLogger, type Logger } from '../observability/logger.js';
import { APPTAINER_PREFIX, apptainerHostEnv, bindSpec, instanceListArgs, instanceStartArgs, instanceStopArgs, overlayCreateArgs, type InstanceStartSpec, type WrapperLimits } from './apptainer-command.js';
import { InstanceWatchdog, newInstanceName, orphanedInstances, ownerOfHostDir, parseInstanceList } from './apptainer-instances.js';
import { isProcessAlive } from './images/process-identity.js';
import { ApptainerSandbox } from './apptainer-sandbox.js';
import { spawnContained, type ContainedRunResult } from './contained-process.js';
import { resolveFdCloser, type FdCloser } from './fd-closer.js';
import { removeTree } from './remove-tree.js';
import type { SandboxDriver, SandboxLimits, SandboxSpec } from './types.js';

export { ApptainerSandbox } from './apptainer-sandbox.js';

/** What one instance start needs from the spec; the driver adds where the workspace lives and the cgroup choice. */
type StartRequest = Omit<InstanceStartSpec, 'cgroupLimits' | 'workspace' | 'limits'> & { limits: Pick<SandboxLimits, 'memoryMb' | 'maxProcesses' | 'diskMb'> };

export interface ApptainerDriverOptions {
  logger?: Logger;
  /** The binary: `apptainer` (default) or `singularity` (SingularityCE 3.x/4.x takes the same flags), or a path. */
  binary?: string;
  /** Host directory under which per-sandbox dirs are created; default the OS temp dir. */
  tmpRoot?: string;
  /**
   * How memory and process limits hold. `cgroups`: `--memory`/`--pids-limit` on the instance, for the whole
   * sandbox (needs root, or cgroups v2 with systemd delegation as non-root — Apptainer's "Limiting Container
   * Resources"). `rlimits`: RLIMIT_AS and RLIMIT_NPROC per process through prlimit in the exec wrapper (per
   * process, not per sandbox: the documented fallback). `auto` (default): cgroups, falling back to rlimits for the
   * driver's life the first time apptainer refuses cgroup limits, with a warning.
   */
  limits?: 'auto' | 'cgroups' | 'rlimits';
  /**
   * How the sandbox's disk (SandboxLimits.diskMb) holds. `overlay`: each sandbox's writable layer is an EXT3 overlay
   * image of diskMb MiB (`apptainer overlay create --sparse`, `instance start --overlay`), holding the workspace,
   * /tmp and every other write: a quota of the whole sandbox, writes past it fail with ENOSPC (as on bubblewrap's
   * size-limited tmpfs). Needs Apptainer 1.2+ or SingularityCE 4.x, and as non-root fuse2fs and fuse-overlayfs on the
   * host. `none`: the workspace is a host dir and the rest of the root a `--writable-tmpfs` (whose size the admin's
   * `sessiondir max size` bounds); no quota of the workspace beyond maxFileMb per file. `auto` (default): overlay,
   * falling back to none for the driver's life, with a warning, the first time apptainer refuses an overlay image.
   */
  disk?: 'auto' | 'overlay' | 'none';
  /** Budget of `instance start` (image mount, namespace set-up), ms. Default 60 s. */
  startTimeoutMs?: number;
  /** Grace before `instance stop` SIGKILLs the instance, s. Default 2. */
  stopGraceS?: number;
}

/**
 * Sandboxes on Apptainer/Singularity, for clusters where it is installed: one `apptainer instance` per sandbox,
 * started with --containall (own PID, IPC, mount namespaces, clean environment), --no-mount home,cwd,tmp,
 * --writable-tmpfs, no network (`--net --network none`) unless the spec asks — and when it does, the host's own network
 * namespace, its loopback services included: `sandbox.networkMode` is bubblewrap's (unprivileged apptainer offers no
 * network type but `none`, and its CNI ones need root) —, the workspace a per-sandbox host dir
 * bound read-write at spec.workdir, and the spec's mounts bound (read-only unless they say otherwise). The image
 * must be a .sif or a root file system directory: Apptainer has no "host /usr" mode.
 *
 * Nothing left behind: instance names are `rollout-apt-<server pid>-<random>`, host dirs `rollout-apt-<pid>-*`;
 * `stop()` stops the instance (SIGINT, SIGKILL after the grace) and removes the dir; `reap()` does the same for
 * what a dead server left and never touches another name or a live server's instances.
 *
 * @example
 * const driver = new ApptainerDriver({ logger, binary: 'singularity' });
 * const sandbox = await driver.start({ ...spec, image: '.cache/images/python.sif' }, signal);
 * try { console.log((await sandbox.exec(['python3', '-c', 'print(1 + 1)'])).stdout); } finally { await sandbox.stop(); }
 */
export class ApptainerDriver implements SandboxDriver {
  readonly name = 'apptainer';
  private readonly log: Logger;
  private readonly binary: string;
  private readonly hostEnv: Record<string, string>;
  private readonly tmpRoot: string;
  private cgroups: boolean;
  private overlay: boolean;
  private probe: Promise<string> | undefined;
  /** Closes what the server inherited before `instance start` and every exec (apptainer passes it all on). */
  private readonly closer: FdCloser = resolveFdCloser();
  /** Stops this server's instances when it dies hard (see InstanceWatchdog). */
  private readonly watchdog: InstanceWatchdog;

  constructor(private readonly options: ApptainerDriverOptions = {}) {
    this.log = (options.logger ?? silentLogger()).child({ component: 'sandbox', driver: 'apptainer' });
    this.binary = options.binary ?? 'apptainer';
    this.hostEnv = apptainerHostEnv(process.env);
    this.tmpRoot = options.tmpRoot ?? tmpdir();
    this.cgroups = (options.limits ?? 'auto') !== 'rlimits';
    this.overlay = (options.disk ?? 'auto') !== 'none';
    this.watchdog = new InstanceWatchdog({ binary: this.binary, env: this.hostEnv, hostDirPrefix: join(this.tmpRoot, `${APPTAINER_PREFIX}-${process.pid}-`), logger: this.log });
  }

  /** Every sandbox was stopped: the watchdog exits. */
  async close(): Promise<void> {
    this.watchdog.close();
  }

  async start(spec: SandboxSpec, signal?: AbortSignal): Promise<ApptainerSandbox> {
    if (spec.image === undefined) {
      throw new RolloutError('sandbox_error', 'the apptainer driver needs an image (a .sif file or a root file system directory); the host layout is bubblewrap-only');
    }
    for (const m of spec.mounts) {
      try {
        bindSpec(m.source, m.target, true);
      } catch (err) {
        throw new RolloutError('environment_error', `sandbox mount: ${(err as Error).message}`);
      }
    }
    throwIfAborted(signal);
    await this.ensureProbe();
    const image = spec.image;
    if (!(await stat(image).catch(() => undefined))) throw new RolloutError('sandbox_error', `image ${image} does not exist`);
    throwIfAborted(signal);

    const hostDir = await realpath(await mkdtemp(join(this.tmpRoot, `${APPTAINER_PREFIX}-${process.pid}-`)));
    const name = newInstanceName();
    this.watchdog.track(name);
    try {
      await chmod(hostDir, 0o700);
      await this.startInstance(hostDir, { image, name, network: spec.network, workdir: spec.workdir, mounts: spec.mounts, limits: spec.limits }, signal);
      const rlimits: WrapperLimits = { maxFileMb: spec.limits.maxFileMb, ...(!this.cgroups && { memoryMb: spec.limits.memoryMb, maxProcesses: spec.limits.maxProcesses }) };
      const sandbox = new ApptainerSandbox({
        spec, binary: this.binary, hostEnv: this.hostEnv, name, rlimits, closer: this.closer, logger: this.log,
        teardown: () => this.teardown(name, hostDir),
      });
      this.log.debug({ sandbox: name, image, hostDir, cgroups: this.cgroups, overlay: this.overlay }, 'sandbox started');
      return sandbox;
    } catch (err) {
      await this.teardown(name, hostDir);
      throw err instanceof RolloutError ? err : RolloutError.from(err, 'sandbox_error');
    }
  }

  /**
   * Stops every instance a dead server of ours left (`instance list --json`, our prefix, an owner PID that is not
   * alive) and removes such servers' host dirs. Called once at start-up.
   */
  async reap(): Promise<{ removed: number }> {
    await this.ensureProbe();
    let removed = 0;
    const list = await this.apptainer(instanceListArgs(), 30_000);
    if (list.exitCode !== 0) throw new RolloutError('sandbox_error', `apptainer instance list failed: ${list.stderr.trim()}`);
    for (const orphan of orphanedInstances(parseInstanceList(list.stdout))) {
      const r = await this.apptainer(instanceStopArgs(orphan.name, { force: true }), 30_000);
      if (r.exitCode === 0) removed += 1;
      else this.log.error({ instance: orphan.name, stderr: r.stderr.trim() }, 'could not stop an orphaned instance');
    }
    for (const entry of await readdir(this.tmpRoot).catch(() => [])) {
      const owner = ownerOfHostDir(entry);
      if (owner === undefined || owner === process.pid || isProcessAlive(owner)) continue;
      await removeTree(join(this.tmpRoot, entry)).then(() => (removed += 1), (err: unknown) => this.log.error({ err, dir: entry }, 'could not remove an orphaned dir'));
    }
    if (removed > 0) this.log.info({ removed }, 'reaped what a previous server left');
    return { removed };
  }

  private async startInstance(hostDir: string, spec: StartRequest, signal: AbortSignal | undefined): Promise<void> {
    const timeoutMs = this.options.startTimeoutMs ?? 60_000;
    let workspace = await this.workspace(hostDir, spec, timeoutMs, signal);
    let r = await this.apptainer(instanceStartArgs({ ...spec, workspace, cgroupLimits: this.cgroups }), timeoutMs, signal, true);
    if (r.exitCode !== 0 && 'overlay' in workspace && this.options.disk !== 'overlay' && !r.aborted && /overlay|fuse2fs|ext3/i.test(r.stderr)) {
      this.noOverlay(`apptainer instance start refused the overlay image: ${r.stderr.trim().slice(0, 500)}`);
      workspace = await this.workspace(hostDir, spec, timeoutMs, signal);
      r = await this.apptainer(instanceStartArgs({ ...spec, workspace, cgroupLimits: this.cgroups }), timeoutMs, signal, true);
    }
    if (r.exitCode !== 0 && this.cgroups && this.options.limits !== 'cgroups' && !r.aborted && /cgroup/i.test(r.stderr)) {
      this.log.warn({ stderr: r.stderr.trim() }, 'apptainer refused cgroup limits: memory and processes are limited per process (rlimits) from now on');
      this.cgroups = false;
      r = await this.apptainer(instanceStartArgs({ ...spec, workspace, cgroupLimits: false }), timeoutMs, signal, true);
    }
    if (r.aborted) throw RolloutError.from(signal?.reason, 'cancelled');
    if (r.timedOut) throw new RolloutError('sandbox_error', `apptainer instance start timed out after ${timeoutMs} ms`);
    if (r.exitCode !== 0) throw new RolloutError('sandbox_error', `apptainer instance start failed (exit code ${r.exitCode ?? r.signal}): ${r.stderr.trim().slice(0, 2000)}`);
  }

  /**
   * The sandbox's workspace: its overlay image (the disk quota, see ApptainerDriverOptions.disk), or a host dir when
   * overlays are off or apptainer cannot make one (then, in `auto`, off for the driver's life).
   */
  private async workspace(hostDir: string, spec: Pick<StartRequest, 'workdir' | 'mounts' | 'limits'>, timeoutMs: number, signal: AbortSignal | undefined): Promise<InstanceStartSpec['workspace']> {
    if (this.overlay) {
      const overlay = join(hostDir, 'overlay.img');
      const inside = (target: string): boolean => target === spec.workdir || target.startsWith(`${spec.workdir.replace(/\/+$/, '')}/`);
      const dirs = [spec.workdir, ...spec.mounts.map((m) => m.target).filter(inside)];
      const r = await this.apptainer(overlayCreateArgs({ path: overlay, sizeMb: spec.limits.diskMb, dirs }), timeoutMs, signal);
      if (r.aborted) throw RolloutError.from(signal?.reason, 'cancelled');
      if (r.exitCode === 0 && !r.timedOut) return { overlay };
      const why = r.timedOut ? `timed out after ${timeoutMs} ms` : `exit code ${r.exitCode ?? r.signal}: ${r.stderr.trim().slice(0, 500)}`;
      if (this.options.disk === 'overlay') throw new RolloutError('sandbox_error', `apptainer overlay create failed (${why}); the driver's disk option is 'overlay'`);
      this.noOverlay(`apptainer overlay create failed (${why})`);
    }
    const hostWorkdir = join(hostDir, 'work');
    await mkdir(hostWorkdir, { mode: 0o755 });
    return { hostWorkdir };
  }

  private noOverlay(why: string): void {
    if (!this.overlay) return;
    this.overlay = false;
    this.log.warn({ why }, 'apptainer cannot use overlay images: sandbox workspaces are host dirs without a disk quota from now on (maxFileMb still bounds each file)');
  }

  /** Stops the instance (grace, then --force) and removes the host dir; logs, never throws. */
  private async teardown(name: string, hostDir: string): Promise<void> {
    const graceS = this.options.stopGraceS ?? 2;
    const soft = await this.apptainer(instanceStopArgs(name, { timeoutS: graceS }), (graceS + 10) * 1000);
    if (soft.exitCode !== 0 && !/no instance found/i.test(soft.stderr)) {
      const hard = await this.apptainer(instanceStopArgs(name, { force: true }), 15_000);
      if (hard.exitCode !== 0 && !/no instance found/i.test(hard.stderr)) this.log.error({ instance: name, stderr: hard.stderr.trim() }, 'instance stop failed');
    }
    await removeTree(hostDir).catch((err: unknown) => this.log.error({ err, hostDir }, 'removing the host dir failed'));
    this.watchdog.untrack(name);
  }

  /** `apptainer --version` once per driver, so a missing binary fails with a message that says what to do. */
  private ensureProbe(): Promise<string> {
    this.probe ??= (async () => {
      const r = await this.apptainer(['--version'], 30_000);
      if (r.exitCode !== 0) throw new RolloutError('sandbox_error', `${this.binary} --version failed (exit code ${r.exitCode ?? r.signal}): ${r.stderr.trim()}`);
      const version = r.stdout.trim();
      this.log.info({ binary: this.binary, version }, 'apptainer sandboxes available');
      return version;
    })().catch((err: unknown) => {
      this.probe = undefined;
      throw err;
    });
    return this.probe;
  }

  /**
   * Runs the binary. `closed`: behind the descriptor closer (an `instance start`, whose instance lives on with what it
   * inherited); the rest run bare, so a missing binary is the spawn's ENOENT and the message below.
   */
  private async apptainer(args: string[], timeoutMs: number, signal?: AbortSignal, closed = false): Promise<ContainedRunResult> {
    const [command, ...rest] = closed ? this.closer.wrap([], [this.binary, ...args]) : [this.binary, ...args];
    const r = await spawnContained(command!, rest, { timeoutMs, outputLimitBytes: 1 << 20, env: this.hostEnv, ...(signal && { signal }) }).result;
    if (r.spawnError) {
      const missing = (r.spawnError as NodeJS.ErrnoException).code === 'ENOENT';
      throw new RolloutError(
        'sandbox_error',
        missing
          ? `the apptainer driver needs '${this.binary}' on PATH: install Apptainer (or SingularityCE and set sandbox.apptainerPath to singularity), or use sandbox.driver 'bwrap'`
          : `cannot run ${this.binary}: ${r.spawnError.message}`,
        { cause: r.spawnError },
      );
    }
    return r;
  }
}
