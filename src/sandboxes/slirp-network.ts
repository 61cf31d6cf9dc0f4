import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import type { Readable, Writable } from 'node:stream';
import { RolloutError } from '../errors.js';
import { LAUNCH_ENV } from './bwrap-holder.js';
import { CappedOutput } from './capped-output.js';
import type { FdCloser } from './fd-closer.js';

/** The DNS forwarder slirp4netns answers on inside the sandbox (its default CIDR 10.0.2.0/24, address + 3). */
export const SLIRP_DNS = '10.0.2.3';
/** /etc/resolv.conf of an isolated sandbox: the host's may name a loopback resolver the sandbox cannot reach. */
export const SLIRP_RESOLV_CONF = `nameserver ${SLIRP_DNS}\n`;

/**
 * IPv4 destinations an isolated sandbox must not reach, refused inside its own network namespace before it runs
 * anything (NetworkPolicy): what a host typically reaches besides the internet — the LAN, the cloud provider's
 * metadata and platform endpoints (credentials) — and what is no unicast destination at all. slirp4netns's own
 * 10.0.2.0/24 is inside 10.0.0.0/8: only its DNS forwarder, port 53, is let through (ALLOWED_DNS).
 */
export const PRIVATE_DESTINATIONS: readonly string[] = [
  '0.0.0.0/8', // "this network"
  '10.0.0.0/8', // RFC 1918 (and slirp4netns's gateway 10.0.2.2: the host's loopback, refused by slirp too)
  '100.64.0.0/10', // shared address space (CGNAT; Alibaba Cloud's metadata 100.100.100.200)
  '169.254.0.0/16', // link-local: cloud metadata 169.254.169.254, ECS task credentials 169.254.170.2
  '172.16.0.0/12', // RFC 1918
  '192.0.0.0/24', // IETF protocol assignments (Oracle Cloud's legacy metadata 192.0.0.192)
  '192.168.0.0/16', // RFC 1918
  '168.63.129.16/32', // Azure's platform endpoint (WireServer: agent and extension configuration)
  '224.0.0.0/4', // multicast (mDNS, SSDP of the LAN)
  '240.0.0.0/4', // reserved, and the limited broadcast 255.255.255.255
];

/** What a sandbox must reach in slirp4netns's 10.0.2.0/24: the DNS forwarder, on port 53 only (UDP and TCP). */
const ALLOWED_DNS = ['udp', 'tcp'].map((proto) => `to ${SLIRP_DNS}/32 ipproto ${proto} dport 53`);

/** IPv4 CIDR (a.b.c.d/n): the form of sandbox.networkAllow's entries. */
const IPV4_CIDR = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}\/([12]?\d|3[0-2])$/;

/** Whether `cidr` is an IPv4 CIDR such as 10.1.0.0/16 (what sandbox.networkAllow takes). */
export function isIpv4Cidr(cidr: string): boolean {
  return IPV4_CIDR.test(cidr);
}

/**
 * Where an isolated sandbox may not go, and the exceptions an operator allowed. Applied by slirp-network.ts as policy
 * routing rules (`ip rule`, iproute2) in the sandbox's network namespace, by the server while it holds the namespace
 * and before the sandbox runs anything: the sandbox's processes (no capability in the user namespace that owns the
 * namespace) cannot change them. A refused destination fails at once (EACCES) inside the sandbox; nothing reaches
 * slirp4netns. Rule order: the DNS forwarder, then `allowed`, then `blocked`, then the main table (slirp's default
 * route), so an allowed CIDR wins over a blocked one that contains it.
 */
export interface NetworkPolicy {
  /** IPv4 CIDRs refused: PRIVATE_DESTINATIONS and the host's own addresses (hostAddresses()). */
  blocked: readonly string[];
  /** IPv4 CIDRs reachable although `blocked` holds them (config `sandbox.networkAllow`). */
  allowed: readonly string[];
}

/**
 * The host's own IPv4 addresses outside 127.0.0.0/8 (as /32), at the time of the call: services the host runs on them
 * or on 0.0.0.0 (an engine, this server's port) must be out of a sandbox's reach. 127.0.0.0/8 is the sandbox's own
 * loopback and never leaves it.
 */
export function hostAddresses(): string[] {
  const out = new Set<string>();
  for (const a of Object.values(networkInterfaces()).flat()) {
    if (a !== undefined && a.family === 'IPv4' && !a.address.startsWith('127.')) out.add(`${a.address}/32`);
  }
  return [...out];
}

/** The default policy of a driver whose operator allowed `allowed`: private ranges and the host's addresses refused. */
export function defaultNetworkPolicy(allowed: readonly string[] = []): NetworkPolicy {
  return { blocked: [...PRIVATE_DESTINATIONS, ...hostAddresses()], allowed };
}

/** Preference of the first rule: before the main table's (32766), after the local table's (0). */
const FIRST_RULE_PREF = 10_000;

/**
 * `ip -batch` input of a policy (IPv4 rules), and of the IPv6 rule: slirp4netns runs without --enable-ipv6, so no IPv6
 * packet leaves through it; the rule refuses every IPv6 destination but the sandbox's own (the local table) all the
 * same. Pure.
 */
export function policyBatches(policy: NetworkPolicy): { ipv4: string; ipv6: string } {
  let pref = FIRST_RULE_PREF;
  const lines = [
    ...ALLOWED_DNS.map((sel) => `rule add pref ${pref++} ${sel} lookup main`),
    ...policy.allowed.map((cidr) => `rule add pref ${pref++} to ${cidr} lookup main`),
    ...policy.blocked.map((cidr) => `rule add pref ${pref++} to ${cidr} prohibit`),
  ];
  return { ipv4: `${lines.join('\n')}\n`, ipv6: `rule add pref ${pref} prohibit\n` };
}

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
  /**
   * Destinations refused in the sandbox's namespace once slirp4netns has set it up and before start() returns (see
   * NetworkPolicy); a policy that cannot be set fails the start.
   */
  policy: NetworkPolicy;
  /** The iproute2 `ip` binary that sets the policy (a path, or a name looked up on PATH); default `ip`. */
  ipPath?: string;
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
 * out of reach, and so, the namespace being the sandbox's own, are the host's abstract UNIX sockets. Once it is up,
 * start() refuses the private destinations (cloud metadata, the LAN, the host's own addresses: NetworkPolicy) inside
 * the namespace before returning; what remains is the internet and the DNS forwarder (see the README).
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
      child.on('error', () => undefined);
      ready.resume();
      // Before the sandbox runs anything: a sandbox whose rules could not be set never gets its network.
      await applyPolicy(options);
    } catch (err) {
      // Gone (reaped) before the failure is reported; bounded, so a process the kernel is slow to end cannot hang start.
      net.kill();
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([net.exited, new Promise((resolve) => (timer = setTimeout(resolve, KILL_WAIT_MS)))]);
      clearTimeout(timer);
      throw err;
    }
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

/** Descriptors of a launched policy step: 3 the netns, 4 the user namespace that owns it. */
const POLICY_NETNS_FD = 3;
const POLICY_USERNS_FD = 4;

/**
 * Sets `options.policy` in the sandbox's network namespace: `ip -batch` of the IPv4 rules, then `ip -6` of the IPv6 one
 * (skipped where the kernel has no IPv6: then nothing of it exists to refuse). Entered like slirp4netns (the owning
 * user namespace first when the server is not root). Throws sandbox_error with ip's own words when it cannot.
 */
async function applyPolicy(options: SlirpStartOptions): Promise<void> {
  // An operator who allowed everything (0.0.0.0/0) asked for no rule: nothing is run (a host without policy routing).
  if (options.policy.allowed.some((cidr) => cidr.endsWith('/0'))) return;
  const batches = policyBatches(options.policy);
  await runIp(options, [], batches.ipv4);
  if (existsSync('/proc/net/if_inet6')) await runIp(options, ['-6'], batches.ipv6);
}

function runIp(options: SlirpStartOptions, family: string[], batch: string): Promise<void> {
  const ip = options.ipPath ?? 'ip';
  const argv = options.closer.wrap([POLICY_NETNS_FD, POLICY_USERNS_FD], [
    'nsenter', ...(options.enterUserns ? ['--preserve-credentials', `--user=/proc/self/fd/${POLICY_USERNS_FD}`] : []),
    `--net=/proc/self/fd/${POLICY_NETNS_FD}`, '--', ip, ...family, '-batch', '-',
  ]);
  const child = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'ignore', 'pipe', options.netnsFd, options.usernsFd], env: LAUNCH_ENV });
  const stderr = new CappedOutput(8192);
  child.stderr?.on('data', (c: Buffer) => stderr.push(c));
  (child.stdin as Writable).on('error', () => undefined).end(batch);
  const what = `cannot restrict the sandbox's network (${ip} ${[...family, 'rule'].join(' ')}, iproute2)`;
  return new Promise<void>((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined = undefined;
    const done = (err?: RolloutError): void => {
      clearTimeout(timer);
      options.signal?.removeEventListener('abort', onAbort);
      child.off('close', onClose).off('error', onError);
      if (err === undefined) {
        resolve();
        return;
      }
      child.kill('SIGKILL');
      reject(err);
    };
    const onAbort = (): void => done(RolloutError.from(options.signal?.reason, 'cancelled'));
    const onClose = (code: number | null, sig: string | null): void =>
      code === 0 ? done() : done(new RolloutError('sandbox_error', `${what}: exit ${code ?? sig}: ${stderr.text().trim()}`));
    const onError = (err: Error): void => done(new RolloutError('sandbox_error', `${what}: ${err.message}`, { cause: err }));
    timer = setTimeout(() => done(new RolloutError('sandbox_error', `${what}: no answer within ${options.timeoutMs} ms`)), options.timeoutMs);
    child.once('close', onClose).once('error', onError);
    if (options.signal?.aborted) onAbort();
    else options.signal?.addEventListener('abort', onAbort, { once: true });
  });
}
