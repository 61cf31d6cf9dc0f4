import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, constants, fstatSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import type { Readable, Writable } from 'node:stream';
import { RolloutError } from '../errors.js';
import { NAMESPACES, type NamespaceFds } from './bwrap-command.js';
import { CappedOutput } from './capped-output.js';
import type { FdCloser } from './fd-closer.js';

/** Environment of every host-side launcher: nothing of the server's own environment reaches a sandbox. */
export const LAUNCH_ENV = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', LANG: 'C.UTF-8' };
const INFO_FD = 4;
/** Descriptor of the holder's launch from which bwrap reads `--ro-bind-data` contents. */
export const DATA_FD = 3;

/** Namespace files and root of the holder, held open by the server for the sandbox's life. */
export interface HeldNamespaces {
  /** Open descriptors in this process, in the order of `namespaceFdNumbers` below (NAMESPACES, root, then owner). */
  readonly fds: readonly number[];
  /**
   * The user namespace that owns the sandbox's other namespaces, when it is not the holder's own user namespace
   * (also the last of `fds`). Held for a server that is not root: bwrap's `--disable-userns` puts the holder in a
   * nested user namespace, and only the owner's capabilities let such a server join the mount, PID, network, ...
   * namespaces (see enterOwnerArgv in bwrap-command.ts).
   */
  readonly owner?: number;
  close(): void;
}

/**
 * The running holder of one sandbox: bwrap's monitor (our child, on the host) and pid 1 of the sandbox's PID
 * namespace, which lives until its stdin — the control pipe — closes. Pid 1 is the sandbox init
 * (init/sandbox-init.c: the holder itself, which the sandbox's processes cannot signal), or, without one, bwrap's
 * init with a holder shell as pid 2. Killing pid 1 makes the kernel kill every process of the namespace; the monitor
 * then exits.
 */
export class Holder {
  private closed = false;
  /** Resolves when bwrap's monitor has exited (and so has the whole PID namespace). */
  readonly exited: Promise<void>;

  private constructor(
    private readonly child: ChildProcess,
    /** Host pid of the PID namespace's init. */
    readonly initPid: number,
    /** Host pid of the holder (the init itself, or the holder shell), whose namespaces commands enter. */
    readonly holderPid: number,
    readonly namespaces: HeldNamespaces,
  ) {
    this.exited = new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve();
      else child.once('close', () => resolve());
    });
    child.once('exit', () => {
      this.closed = true;
    });
  }

  /** Whether bwrap's monitor is still running (the sandbox is alive). */
  get alive(): boolean {
    return !this.closed;
  }

  /**
   * Starts the holder from its full host argv (see buildHolderArgv) and waits until it says it is up. Throws
   * sandbox_error with bwrap's own words when it cannot start; the signal kills a half-started holder.
   */
  static async start(
    argv: readonly string[],
    options: {
      signal?: AbortSignal; lowerOomScore: boolean; timeoutMs: number; onOomScoreError?: (err: unknown) => void; holderIsInit: boolean; closer: FdCloser;
      /**
       * A Python interpreter with which to find the owner of the sandbox's namespaces (HeldNamespaces.owner): given
       * when the server is not root; without it, nothing of a nested user namespace is held.
       */
      ownerPython?: string;
      /** Bytes bwrap reads from DATA_FD (`--ro-bind-data`, see HolderCommandSpec.resolvConfFd); none: fd 3 is not passed. */
      data?: string;
    },
  ): Promise<Holder> {
    // Only the control pipes, the info pipe and the data pipe reach bwrap (and so the sandbox): see fd-closer.ts.
    const launch = options.closer.wrap(options.data !== undefined ? [DATA_FD, INFO_FD] : [INFO_FD], argv);
    const child = spawn(launch[0]!, launch.slice(1), { detached: true, stdio: ['pipe', 'pipe', 'pipe', options.data !== undefined ? 'pipe' : 'ignore', 'pipe'], env: LAUNCH_ENV });
    if (options.data !== undefined) {
      // bwrap reads it to its end before the sandbox runs anything; a few bytes, within any pipe's buffer.
      (child.stdio[DATA_FD] as Writable).on('error', () => undefined).end(options.data);
    }
    const stderr = new CappedOutput(8192);
    child.stderr?.on('data', (c: Buffer) => stderr.push(c));
    (child.stdin as Writable).on('error', () => undefined);
    let info = '';
    const infoPipe = child.stdio[INFO_FD] as Readable;
    infoPipe.on('data', (c: Buffer) => (info += c.toString('utf8'))).on('error', () => undefined);
    const killGroup = (): void => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {
        // Already gone.
      }
    };

    await new Promise<void>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined = undefined;
      const fail = (err: RolloutError): void => {
        cleanup();
        killGroup();
        reject(err);
      };
      const onAbort = (): void => fail(RolloutError.from(options.signal?.reason, 'cancelled'));
      const onClose = (code: number | null, sig: string | null): void =>
        fail(new RolloutError('sandbox_error', `bubblewrap failed to start the sandbox (exit ${code ?? sig}): ${stderr.text().trim()}`));
      const onError = (err: Error): void => fail(new RolloutError('sandbox_error', `cannot run ${argv[0]}: ${err.message}`, { cause: err }));
      // Up when the holder said so on stdout and bwrap's info JSON is complete (two pipes, either may come first).
      let up = false;
      const onData = (): void => {
        if (!up || parseInfo(info) === undefined) return;
        cleanup();
        resolve();
      };
      const onUp = (): void => {
        up = true;
        onData();
      };
      const cleanup = (): void => {
        clearTimeout(timer);
        options.signal?.removeEventListener('abort', onAbort);
        child.off('close', onClose).off('error', onError);
        child.stdout?.off('data', onUp);
        infoPipe.off('data', onData);
      };
      timer = setTimeout(() => fail(new RolloutError('sandbox_error', `the sandbox did not start within ${options.timeoutMs} ms`)), options.timeoutMs);
      child.once('close', onClose).once('error', onError);
      child.stdout?.once('data', onUp);
      infoPipe.on('data', onData);
      if (options.signal?.aborted) onAbort();
      else options.signal?.addEventListener('abort', onAbort, { once: true });
    });
    child.stdout?.resume();
    child.on('error', () => undefined);

    try {
      const initPid = parseInfo(info);
      if (initPid === undefined) throw new Error(`no child-pid in bwrap's info: ${info}`);
      const holderPid = options.holderIsInit ? initPid : Number(readFileSync(`/proc/${initPid}/task/${initPid}/children`, 'utf8').trim().split(' ')[0]);
      let namespaces = holdNamespaces(holderPid);
      if (options.ownerPython !== undefined) namespaces = await holdOwner(namespaces, options.ownerPython, options.closer, options.timeoutMs);
      // The holder must be (or be the child of) the monitor's child while we hold its namespaces: then they are
      // this sandbox's.
      if ((!options.holderIsInit && parentOf(holderPid) !== initPid) || parentOf(initPid) !== child.pid) {
        namespaces.close();
        throw new Error('the holder vanished during start-up');
      }
      if (options.lowerOomScore) {
        // The memory limit's OOM killer must pick the user's processes, never the ones that hold the sandbox.
        // Best effort (root without CAP_SYS_RESOURCE gets EACCES): reported, and commands' raised scores
        // (bwrap-command.ts) still make the OOM killer pick the user's processes first.
        for (const pid of new Set([child.pid, initPid, holderPid])) {
          try {
            writeFileSync(`/proc/${pid}/oom_score_adj`, '-1000');
          } catch (err) {
            options.onOomScoreError?.(err);
            break;
          }
        }
      }
      return new Holder(child, initPid, holderPid, namespaces);
    } catch (err) {
      killGroup();
      throw err instanceof RolloutError ? err : new RolloutError('sandbox_error', `sandbox start-up: ${(err as Error).message}`, { cause: err });
    }
  }

  /** Kills the PID namespace (its init) and bwrap's monitor; the kernel kills every process inside. Idempotent. */
  kill(): void {
    this.namespaces.close();
    if (!this.closed) {
      // While the monitor runs, init (its child) cannot have been reaped, so its pid is still the one we know.
      for (const pid of [this.initPid, this.child.pid]) {
        try {
          if (pid !== undefined) process.kill(pid, 'SIGKILL');
        } catch {
          // Already gone.
        }
      }
    }
    (this.child.stdin as Writable | null)?.destroy();
  }
}

/** bwrap's --info-fd JSON's child-pid, or undefined while the JSON is incomplete. */
function parseInfo(info: string): number | undefined {
  try {
    const pid = (JSON.parse(info) as { 'child-pid'?: unknown })['child-pid'];
    return typeof pid === 'number' ? pid : undefined;
  } catch {
    return undefined;
  }
}

function parentOf(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  } catch {
    return undefined;
  }
}

/** Opens the holder's namespace files and root directory (order: NAMESPACES, then root). */
function holdNamespaces(pid: number): HeldNamespaces {
  const fds: number[] = [];
  let open = true;
  try {
    for (const ns of NAMESPACES) fds.push(openSync(`/proc/${pid}/ns/${ns.file}`, constants.O_RDONLY));
    fds.push(openSync(`/proc/${pid}/root`, constants.O_RDONLY | constants.O_DIRECTORY));
  } catch (err) {
    for (const fd of fds) closeSync(fd);
    throw err;
  }
  return {
    fds,
    close: () => {
      if (!open) return;
      open = false;
      for (const fd of fds) closeSync(fd);
    },
  };
}

/** NS_GET_USERNS (linux/nsfs.h): a descriptor of the user namespace owning the namespace of the given descriptor. */
const OWNER_SCRIPT = [
  'import fcntl, sys',
  'print(fcntl.ioctl(3, 0xB701), flush=True)',
  'sys.stdin.read()',
].join('\n');

/**
 * Adds to `held` the user namespace that owns the holder's mount namespace, when it is not the holder's own. Node has
 * no ioctl, and no process lives in that namespace (bwrap's child entered the nested one before it exec'ed the holder):
 * Python asks the kernel (ioctl NS_GET_USERNS on the held mount namespace) and keeps the answer open until we have
 * opened it through /proc/PID/fd. Closes `held` and throws when it cannot.
 */
async function holdOwner(held: HeldNamespaces, python: string, closer: FdCloser, timeoutMs: number): Promise<HeldNamespaces> {
  const mnt = held.fds[NAMESPACES.findIndex((ns) => ns.file === 'mnt')]!;
  const user = held.fds[NAMESPACES.findIndex((ns) => ns.file === 'user')]!;
  const argv = closer.wrap([3], [python, '-I', '-S', '-c', OWNER_SCRIPT]);
  const child = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe', mnt], env: LAUNCH_ENV });
  (child.stdin as Writable).on('error', () => undefined);
  const stderr = new CappedOutput(4096);
  child.stderr?.on('data', (c: Buffer) => stderr.push(c));
  let owner: number | undefined;
  try {
    const fdNumber = await new Promise<number>((resolve, reject) => {
      let out = '';
      const timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
      child.stdout?.on('data', (c: Buffer) => {
        out += c.toString('utf8');
        if (!out.includes('\n')) return;
        clearTimeout(timer);
        const n = Number(out.trim());
        if (Number.isInteger(n) && n >= 0) resolve(n);
        else reject(new Error(`unexpected answer ${JSON.stringify(out.trim())}`));
      });
      child.once('error', (err) => (clearTimeout(timer), reject(err)));
      child.once('close', (code, sig) => (clearTimeout(timer), reject(new Error(`exit ${code ?? sig}: ${stderr.text().trim()}`))));
    });
    owner = openSync(`/proc/${child.pid}/fd/${fdNumber}`, constants.O_RDONLY);
    const a = fstatSync(owner);
    const b = fstatSync(user);
    if (a.dev === b.dev && a.ino === b.ino) {
      // Not nested: the holder's own user namespace owns the rest, and joining it first is enough.
      closeSync(owner);
      return held;
    }
  } catch (err) {
    if (owner !== undefined) closeSync(owner);
    held.close();
    throw new RolloutError('sandbox_error', `cannot find the user namespace that owns the sandbox's namespaces (needed by a server that is not root; ${python} -c 'ioctl NS_GET_USERNS'): ${(err as Error).message}`, { cause: err });
  } finally {
    child.kill('SIGKILL');
  }
  const ownerFd = owner;
  let open = true;
  return {
    fds: [...held.fds, ownerFd],
    owner: ownerFd,
    close: () => {
      if (!open) return;
      open = false;
      held.close();
      closeSync(ownerFd);
    },
  };
}

/**
 * Where the held descriptors land in a launched command: fd 4 onwards, after stdin/out/err and the started fd (the
 * owner, when held, after the root).
 */
export function namespaceFdNumbers(held?: Pick<HeldNamespaces, 'owner'>): NamespaceFds {
  const first = 4;
  const entries = NAMESPACES.map((ns, i) => [ns.file, first + i] as const);
  const fds = { ...Object.fromEntries(entries), root: first + NAMESPACES.length } as NamespaceFds;
  if (held?.owner !== undefined) fds.owner = first + NAMESPACES.length + 1;
  return fds;
}
