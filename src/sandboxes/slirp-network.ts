import { spawn, type ChildProcess } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import { RolloutError } from '../errors.js';
import { LAUNCH_ENV } from './bwrap-holder.js';
import { CappedOutput } from './capped-output.js';
import type { FdCloser } from './fd-closer.js';

/** The DNS forwarder slirp4netns answers on inside the sandbox (its default CIDR 10.0.2.0/24, address + 3). */
export const SLIRP_DNS = '10.0.2.3';
/** /etc/resolv.conf of an isolated sandbox: the host's may name a loopback resolver the sandbox cannot reach. */
export const SLIRP_RESOLV_CONF = `nameserver ${SLIRP_DNS}\n`;

/** Descriptors of the launched slirp4netns: 0 its exit fd, 3 its ready fd, 4 the netns, 5 the user namespace. */
const EXIT_FD = 0;
const READY_FD = 3;
const NETNS_FD = 4;
const USERNS_FD = 5;
/** How long a failed start waits for the killed slirp4netns to be reaped. */
const KILL_WAIT_MS = 5_000;

export interface SlirpStartOptions {
  /** The slirp4netns binary (a path, or a name looked up on PATH). */
  slirpPath: string;
  /** Open descriptors (in this process) of the sandbox's network namespace and of its user namespace. */
  netnsFd: number;
  usernsFd: number;
  /**
   * Whether slirp4netns runs inside `usernsFd` (the user namespace that owns the network namespace, where the server's
   * uid is root): needed when the server is not root, as for commands (enterOwnerArgv in bwrap-command.ts). nsenter
   * puts it there before it starts, not its own `--userns-path` (which only its child joins): `--enable-sandbox` sets
   * up its mount namespace and drops its ids in the parent too, and a non-root parent outside fails ("setegid(0)").
   * Root enters the network namespace directly: it holds CAP_SYS_ADMIN over every namespace, whichever owns it.
   */
  enterUserns: boolean;
  closer: FdCloser;
  timeoutMs: number;
  signal?: AbortSignal;
}

/**
 * Open descriptors of one slirp4netns: each connection the sandbox opens is a socket of slirp4netns on the host, so
 * this bounds the host sockets (and ephemeral ports) one sandbox can hold; the server's own limit is far higher.
 */
export const SLIRP_MAX_FILES = 1024;

/** slirp4netns's argv: NAT'ed TCP/UDP out, the host's 127.0.0.1 cut off, itself confined once set up. */
export function slirpArgv(options: Pick<SlirpStartOptions, 'slirpPath' | 'enterUserns'>): string[] {
  return [
    'prlimit', `--nofile=${SLIRP_MAX_FILES}`, '--',
    ...(options.enterUserns ? ['nsenter', '--preserve-credentials', `--user=/proc/self/fd/${USERNS_FD}`, '--'] : []),
    options.slirpPath, '--configure', '--mtu=65520', '--disable-host-loopback',
    // Its own mount namespace (only /etc and /run of the host), all capabilities but CAP_NET_BIND_SERVICE dropped when
    // root, and a seccomp filter: libslirp parses every packet the sandbox sends.
    '--enable-sandbox', '--enable-seccomp',
    `--ready-fd=${READY_FD}`, `--exit-fd=${EXIT_FD}`, '--netns-type=path', `/proc/self/fd/${NETNS_FD}`, 'tap0',
  ];
}

/**
 * The slirp4netns process that gives one bubblewrap sandbox its network: a tap device in the sandbox's own network
 * namespace (10.0.2.100/24, gateway 10.0.2.2, DNS {@link SLIRP_DNS}), NAT'ed through user-mode TCP/UDP sockets of the
 * host, with `--disable-host-loopback`: the host's 127.0.0.1 (engines' control endpoints, the server's own port) is
 * out of reach, and so, the namespace being the sandbox's own, are the host's abstract UNIX sockets. What the host can
 * reach on other addresses the sandbox can too (see the README).
 *
 * Invariants: it enters the namespace through descriptors the server holds open since the sandbox started (a reused
 * pid cannot redirect it); it dies with the server (its exit fd is the server's end of a socket, which the kernel
 * closes when the server dies) and with the sandbox (`kill()`, called by the sandbox's stop and when its holder exits).
 */
export class SlirpNetwork {
  private gone = false;
  /** Resolves once the slirp4netns process has exited. */
  readonly exited: Promise<void>;

  private constructor(private readonly child: ChildProcess) {
    this.exited = new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve();
      else child.once('exit', () => resolve());
    });
    void this.exited.then(() => (this.gone = true));
  }

  /** Host pid of the slirp4netns process (which the closer in front of it exec'ed into). */
  get pid(): number {
    return this.child.pid!;
  }

  /** Whether slirp4netns is still running. */
  get alive(): boolean {
    return !this.gone && this.child.exitCode === null && this.child.signalCode === null;
  }

  /**
   * Starts slirp4netns on the held namespace and waits until it says the interface is up (its ready fd). Throws
   * sandbox_error with its own words when it cannot (a missing binary, a refused setns); the signal and the timeout
   * kill it.
   */
  static async start(options: SlirpStartOptions): Promise<SlirpNetwork> {
    const argv = options.closer.wrap([READY_FD, NETNS_FD, USERNS_FD], slirpArgv(options));
    const child = spawn(argv[0]!, argv.slice(1), {
      detached: true,
      // stdin is the exit fd: this process's end closes when the server dies, however it dies. slirp4netns talks on
      // stdout; only stderr is kept (for the error message).
      stdio: ['pipe', 'ignore', 'pipe', 'pipe', options.netnsFd, options.usernsFd],
      env: LAUNCH_ENV,
    });
    const net = new SlirpNetwork(child);
    const stderr = new CappedOutput(8192);
    child.stderr?.on('data', (c: Buffer) => stderr.push(c));
    (child.stdin as Writable).on('error', () => undefined);
    const ready = child.stdio[READY_FD] as Readable;
    ready.on('error', () => undefined);
    try {
      await new Promise<void>((resolve, reject) => {
        let timer: NodeJS.Timeout | undefined = undefined;
        const cleanup = (): void => {
          clearTimeout(timer);
          options.signal?.removeEventListener('abort', onAbort);
          child.off('exit', onExit).off('error', onError);
          ready.off('data', onReady);
        };
        const fail = (err: RolloutError): void => {
          cleanup();
          reject(err);
        };
        const onReady = (): void => {
          cleanup();
          resolve();
        };
        const onAbort = (): void => fail(RolloutError.from(options.signal?.reason, 'cancelled'));
        const onExit = (code: number | null, sig: string | null): void =>
          fail(new RolloutError('sandbox_error', `slirp4netns failed to set up the sandbox's network (exit ${code ?? sig}): ${stderr.text().trim()}`));
        const onError = (err: Error): void => fail(new RolloutError('sandbox_error', `cannot run ${options.slirpPath}: ${err.message}`, { cause: err }));
        timer = setTimeout(() => fail(new RolloutError('sandbox_error', `slirp4netns did not set up the sandbox's network within ${options.timeoutMs} ms`)), options.timeoutMs);
        child.once('exit', onExit).once('error', onError);
        ready.once('data', onReady);
        if (options.signal?.aborted) onAbort();
        else options.signal?.addEventListener('abort', onAbort, { once: true });
      });
    } catch (err) {
      // Gone (reaped) before the failure is reported; bounded, so a process the kernel is slow to end cannot hang start.
      net.kill();
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([net.exited, new Promise((resolve) => (timer = setTimeout(resolve, KILL_WAIT_MS)))]);
      clearTimeout(timer);
      throw err;
    }
    child.on('error', () => undefined);
    ready.resume();
    return net;
  }

  /** Ends slirp4netns (its exit fd, then SIGKILL to its process group); the sandbox loses its network. Idempotent. */
  kill(): void {
    (this.child.stdin as Writable | null)?.destroy();
    // While the child is not reaped its pid (and process group) cannot be anyone else's.
    if (this.alive && this.child.pid !== undefined) {
      try {
        process.kill(-this.child.pid, 'SIGKILL');
      } catch {
        // Already gone.
      }
    }
  }
}
