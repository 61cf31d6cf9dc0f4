import { RolloutError, throwIfAborted } from '../errors.js';
import { frameCommand, MarkerScanner, newNonce, sentinelLine, shellQuote, type Marker } from './shell-framing.js';
import { interruptShell, type SpawnFunction } from './shell-interrupt.js';
import { CappedOutput } from './capped-output.js';
import type { PersistentShell, Sandbox, SandboxProcess, ShellResult, ShellRunOptions } from './types.js';

export interface BashShellOptions {
  /** Bytes of output kept per command; the rest is counted and reported as dropped. */
  outputLimitBytes: number;
  /** Timeout of a command whose `run` gives none, ms. */
  defaultTimeoutMs: number;
  /** What is left of the sandbox's wall clock, ms: bounds every timeout; at 0 `run` fails with deadline_exceeded. */
  remainingMs?: () => number;
  /** How long a timed-out command may take to give the shell back before the shell is restarted, ms. Default 1000. */
  interruptGraceMs?: number;
  /**
   * Explains a shell that would not start, from its stderr: an error to throw instead of the generic
   * sandbox_error (e.g. the sandbox is at its own process limit: SandboxLimitError), or undefined.
   */
  startFailure?: (stderr: string) => RolloutError | undefined;
}

/** Why a shell was restarted after its frame broke (restartBroken); shown to the model. */
const BROKEN_BEFORE =
  'an earlier command left it unable to run commands (it disabled or redefined a builtin the shell relies on, made one of its variables readonly, or used up its file descriptors); this command ran in the new shell';
const BROKEN_FUNCTION = 'this command defined a function named printf, builtin or shopt, which the shell relies on; the command ran, its exit code is shown';
const BROKEN_UNUSABLE =
  'this command left the shell unable to run commands (e.g. it used up its file descriptors or disabled a builtin the shell relies on); the command ran, its exit code is shown';
const BROKEN_TAMPERED = "this command changed the shell's own bookkeeping (e.g. made one of its __rollout_ variables readonly); its exit code is unknown";
const STOPPED =
  'this command made the shell stop running commands (set -n, or a DEBUG trap under shopt -s extdebug that skips them); its exit code is unknown';

/**
 * Pause after each chunk of a command's output past the output limit (and PAST_LIMIT_FREE_BYTES), ms. It is only
 * counted, yet read as fast as it was written it cost the server ~0.3 of a core (a background `yes &` while the model
 * runs `sleep`, looking for the end marker behind it). Paused, the writer blocks on its full pipe: the server reads
 * at most about 64 KiB per pause (~5 MB/s: a command printing 100 MB more than the limit takes ~20 s), and the marker
 * still arrives within a few pauses of the command's end.
 */
const PAST_LIMIT_PAUSE_MS = 10;
/** Bytes past the output limit read at full speed first (a command that prints a few MB too many stays quick). */
const PAST_LIMIT_FREE_BYTES = 8 * 1024 * 1024;

/** Bytes of the shell's stderr read per command (the end of it kept) to see whether it parsed the frame's sentinel. */
const STDERR_PER_COMMAND = 16 * 1024;
/** How long to wait for the rest of an ended shell's stderr, ms. */
const STDERR_SETTLE_MS = 1000;

/** Bytes of shell stderr kept to explain a shell that would not start. */
const STDERR_KEEP = 2048;

type Event = { kind: 'marker' } | { kind: 'ended' } | { kind: 'timer' } | { kind: 'aborted' };

/** One running bash and the streams the shell reads from it. */
interface Live {
  proc: SandboxProcess;
  /** Settles when the process exited and its stdout closed. */
  ended: Promise<void>;
  stderr: CappedOutput;
  /** The last bytes of the shell's stderr (sentinelLine), and how many were read since the last command was sent. */
  stderrTail: Buffer;
  stderrSinceSend: number;
  /** Settles when the shell's stderr ended. */
  stderrEnded: Promise<void>;
  /** In-sandbox PID of the shell, from its first marker. */
  pid: number;
  /** Set once `ended` settled. */
  done: boolean;
  /** How the shell process exited, set as soon as it did (before its pipes closed and `ended` settled). */
  exit?: { exitCode: number | null; signal: string | null };
  /** Reading is paused for PAST_LIMIT_PAUSE_MS. */
  throttled: boolean;
}

/**
 * The result of a command run in a new shell because the old one had ended (`died`: BashShell.reapDead's words): a
 * restart, its reason first, then any restart of the new shell during the command.
 */
function ranAfterDeath(result: ShellResult, died: string, started: number): ShellResult {
  const restartReason = result.restartReason === undefined ? died : `${died}; then ${result.restartReason}`;
  return { ...result, restarted: true, restartReason, durationMs: performance.now() - started };
}

/**
 * The persistent shell of a sandbox, for every driver: built only on `spawn(['bash', '--noprofile', '--norc'])`
 * (drivers construct it as `new BashShell(this, { ... })` in `shell()`). The wire format is in shell-framing.ts.
 *
 * Invariants: commands run one at a time in call order; `$?`, the cwd, exported and plain variables carry over;
 * output is stdout and stderr interleaved as written, capped, decoded as UTF-8 with replacement. A timed-out
 * command is interrupted from inside the sandbox (shell-interrupt.ts) and the shell kept; when it does not give
 * the shell back within the grace period, or the command ended the shell (`exit 3`), the shell is restarted in
 * the last known cwd and the result says `restarted: true` (variables reset). A shell that ended between commands
 * (a background job killed it, a trap it set ran when the next command arrived) is never handed a command: the
 * command runs once in a new shell, and its result says `restarted: true` with a `restartReason` naming how the old
 * one ended (told once: the command after it runs in the new shell). Whether the shell began a command is known from
 * the frame's ack line (frameCommand), so a shell found dead only after the command was written is no exception.
 * A shell that cannot be restarted (closed with its sandbox, wall clock used up) fails the command as the
 * sandbox's error. An abort kills the shell and throws `cancelled`; the next `run` starts a new one.
 *
 * Security argument of the framing. Accidental forgery is impossible: the end marker carries a fresh 128-bit
 * nonce per command that exists nowhere the command can see while it runs (not in argv, environment, files,
 * history or shell variables; it reaches the shell's stdin only right behind the command, and the command's own
 * stdin is /dev/null, so `cat` or `read` cannot consume it). Output containing marker-like text, old nonces or
 * the frame itself is plain output. Remaining assumption: the command does not attack the control channel on
 * purpose. A command runs inside the very shell that frames it, so a hostile one can reach that channel — open
 * the shell's stdin through /proc/$$/fd/0 or a saved descriptor, forge the frame's canary, or `exec` a
 * program speaking the protocol — and lie about its own exit status and cwd. That can only mislead the model
 * about its own command; the host's limits (output cap, timeouts, restart on a garbled marker) still hold.
 * Commands that merely change the shell under the frame (a function named `eval` or `printf`, `enable -n eval`,
 * `ulimit -n 3`) are another matter: the frame does not run on what they change, or reports itself broken, and
 * the shell is restarted with a `restartReason` (restartBroken) instead of answering every later command falsely.
 * So are commands that stop the shell from running commands at all (`set -n`, a DEBUG trap under `shopt -s extdebug`
 * that skips them): the shell then parses the line after the frame (sentinelLine) and ends at once, and the result
 * says why (parsedSentinel). Other states are undone by the frame itself: `exec >file` lasts until the end of its
 * command, aliases (also of reserved words) are not expanded in the frame, and the frame's own commands write to
 * /dev/null (a DEBUG trap or `BASH_XTRACEFD=1` does not show them). A DEBUG trap does see the frame's commands
 * (BASH_COMMAND, with the nonce) and variables (the canary), so a deliberate one can forge a marker: it is a
 * deliberate attack on the control channel, like the ones above. Hence:
 * nothing that grades a model (evaluation, tests deciding a reward) may trust a shell the model has used; run
 * such checks with `Sandbox.exec`, a fresh process.
 *
 * @example
 * // in a driver
 * shell(): PersistentShell {
 *   return (this.#shell ??= new BashShell(this, { outputLimitBytes: limits.outputLimitBytes, defaultTimeoutMs: limits.commandTimeoutMs, remainingMs: () => this.remainingMs }));
 * }
 */
export class BashShell implements PersistentShell {
  private readonly spawn: SpawnFunction;
  private readonly graceMs: number;
  private live: Live | undefined;
  private scanner: MarkerScanner | undefined;
  /** Output that arrived between commands (background jobs), shown with the next command's output. */
  private idle: Buffer[] = [];
  private idleBytes = 0;
  private wake: (() => void) | undefined;
  private cwd: string | undefined;
  private lastStatus = 0;
  private everStarted = false;
  private closed = false;
  private queue: Promise<unknown> = Promise.resolve();

  /** The shell of a driver's sandbox: its output limit and command timeout, bounded by its remaining wall clock. */
  static forSandbox(sandbox: Pick<Sandbox, 'spawn' | 'spec'> & { readonly remainingMs: number }, startFailure?: BashShellOptions['startFailure']): BashShell {
    return new BashShell(sandbox, {
      outputLimitBytes: sandbox.spec.limits.outputLimitBytes,
      defaultTimeoutMs: sandbox.spec.limits.commandTimeoutMs,
      remainingMs: () => sandbox.remainingMs,
      ...(startFailure !== undefined && { startFailure }),
    });
  }

  constructor(
    sandbox: Pick<Sandbox, 'spawn'> | SpawnFunction,
    private readonly options: BashShellOptions,
  ) {
    this.spawn = typeof sandbox === 'function' ? sandbox : (argv, spawnOptions) => sandbox.spawn(argv, spawnOptions);
    this.graceMs = options.interruptGraceMs ?? 1000;
  }

  run(command: string, options: ShellRunOptions = {}): Promise<ShellResult> {
    const result = this.queue.then(() => this.runNow(command, options));
    this.queue = result.catch(() => undefined);
    return result;
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.kill();
  }

  /** `retried`: this is the second attempt after a broken frame (restartBroken); a third one is not made. */
  private async runNow(command: string, options: ShellRunOptions, retried = false): Promise<ShellResult> {
    if (this.closed) throw new RolloutError('sandbox_error', 'the shell is closed');
    if (command.includes('\0')) throw RolloutError.invalid('command', 'contains a NUL byte');
    const { signal } = options;
    throwIfAborted(signal);
    const remaining = this.options.remainingMs?.() ?? Infinity;
    if (remaining <= 0) throw new RolloutError('deadline_exceeded', "the sandbox's wall-clock budget is used up");
    const timeoutMs = Math.max(1, Math.min(options.timeoutMs ?? this.options.defaultTimeoutMs, remaining));
    const started = performance.now();
    // The shell ended while no command ran (a background job killed it, `(sleep 1; kill -9 $$) &`): this command is not
    // sent to it but run in a new shell (started below, as after any restart), and its result says once why.
    const died = this.live?.exit === undefined ? undefined : await this.reapDead(this.live);
    const result = await this.runStarted(command, options, retried, timeoutMs, started);
    return died === undefined ? result : ranAfterDeath(result, died, started);
  }

  /** Runs `command` in the live shell, started first when there is none (runNow). */
  private async runStarted(command: string, options: ShellRunOptions, retried: boolean, timeoutMs: number, started: number): Promise<ShellResult> {
    const { signal } = options;
    let restarted = false;
    if (!this.live) {
      restarted = this.everStarted;
      await this.start();
    }
    const live = this.live!;
    const scanner = this.send(command);
    let event = await this.next(scanner, live, timeoutMs, signal);
    if (event.kind === 'aborted') {
      await this.kill();
      throw RolloutError.from(signal?.reason, 'cancelled');
    }
    const timedOut = event.kind === 'timer';
    if (timedOut) {
      // Interrupt from inside; rounds until the shell hands back control or the grace period is over.
      const graceEnd = performance.now() + this.graceMs;
      while (event.kind === 'timer' && performance.now() < graceEnd) {
        await interruptShell(this.spawn, live.pid);
        event = await this.next(scanner, live, Math.min(250, Math.max(1, graceEnd - performance.now())), signal);
      }
      if (event.kind === 'aborted') {
        await this.kill();
        throw RolloutError.from(signal?.reason, 'cancelled');
      }
    }
    const outcome = scanner.outcome;
    if (event.kind === 'marker' && outcome && 'marker' in outcome && outcome.marker.broken !== undefined) {
      return this.restartBroken(command, options, scanner, outcome.marker, timedOut, retried, started);
    }
    if (event.kind === 'marker' && outcome && 'marker' in outcome) {
      this.finish(scanner, outcome.marker, outcome.rest);
      this.lastStatus = timedOut ? 137 : outcome.marker.status;
      return this.result(scanner, timedOut ? null : outcome.marker.status, timedOut, restarted, started);
    }
    if (event.kind === 'ended' && !timedOut && !scanner.acked && !retried) {
      // The shell ended before it began this command (a trap fired while it waited for input, or it died just before
      // the command was written): what it printed until then is output between commands, and the command is run once
      // in a new shell, as when the shell is found dead before sending (runNow).
      scanner.flush();
      const before = scanner.output.text();
      this.scanner = undefined;
      const died = await this.reapDead(live);
      if (before !== '') this.keepIdle(Buffer.from(before));
      return ranAfterDeath(await this.runStarted(command, options, true, timeoutMs, started), died, started);
    }
    // The shell ended (exit, kill, crash), garbled its marker, or would not give control back: start a new one.
    let exitCode = event.kind === 'ended' && !timedOut ? ((await live.proc.exited).exitCode ?? null) : null;
    // A shell that stopped running commands ends at the frame's sentinel line (a syntax error, exit status 2).
    const stopped = exitCode === 2 && (await this.parsedSentinel(live, scanner.nonce));
    if (stopped) exitCode = null;
    await this.kill();
    scanner.flush();
    this.scanner = undefined;
    this.lastStatus = exitCode ?? 137;
    await this.start();
    const result = this.result(scanner, exitCode, timedOut, true, started);
    return stopped ? { ...result, restartReason: STOPPED } : result;
  }

  /**
   * Clears away a shell that ended between commands, keeping what it printed before it ended (shown with the next
   * command's output, like any output between commands), and says how it ended, for the model.
   */
  private async reapDead(live: Live): Promise<string> {
    const { exitCode, signal } = live.exit!;
    resume(live.proc); // a paused stdout never sees its end
    await live.ended; // its last output, still read as this shell's (onData)
    await this.kill();
    const how = signal !== null ? `it was killed by ${signal}` : exitCode !== null && exitCode > 128 ? `it was killed by signal ${exitCode - 128}` : `exit code ${exitCode ?? 'unknown'}`;
    return `the shell ended between the previous command and this one (${how}; e.g. a background job killed it, or a trap it had set ran), so this command ran in a new shell`;
  }

  /** Whether the ended shell `live` complained about the sentinel line of `nonce` on its stderr. */
  private async parsedSentinel(live: Live, nonce: string): Promise<boolean> {
    live.proc.stderr.resume();
    await Promise.race([live.stderrEnded, new Promise((resolve) => setTimeout(resolve, STDERR_SETTLE_MS))]);
    return live.stderrTail.toString('latin1').includes(sentinelLine(nonce));
  }

  /**
   * The frame reported itself broken: an earlier or this command changed the shell so that it no longer runs commands
   * as the frame expects (module comment of shell-framing.ts). Its answers cannot be trusted any more, so the shell
   * is restarted, and the result says why instead of passing on what the broken shell claimed. A command that did not
   * run at all ('not-run') is run once in the new shell.
   */
  private async restartBroken(
    command: string,
    options: ShellRunOptions,
    scanner: MarkerScanner,
    marker: Marker,
    timedOut: boolean,
    retried: boolean,
    started: number,
  ): Promise<ShellResult> {
    await this.kill();
    this.scanner = undefined;
    if (marker.broken === 'not-run' && !retried && !timedOut) {
      const again = await this.runNow(command, options, true);
      const restartReason = again.restartReason ?? BROKEN_BEFORE;
      return { ...again, restarted: true, restartReason, durationMs: performance.now() - started };
    }
    const ran = (marker.broken === 'function' || marker.broken === 'unusable') && !timedOut;
    this.lastStatus = ran ? marker.status : 137;
    if (ran && marker.cwd !== '') this.cwd = marker.cwd;
    await this.start();
    const result = this.result(scanner, ran ? marker.status : null, timedOut, true, started);
    const reasons = { function: BROKEN_FUNCTION, unusable: BROKEN_UNUSABLE, 'not-run': BROKEN_BEFORE, tampered: BROKEN_TAMPERED };
    return { ...result, restartReason: reasons[marker.broken!] };
  }

  private result(scanner: MarkerScanner, exitCode: number | null, timedOut: boolean, restarted: boolean, started: number): ShellResult {
    return {
      exitCode,
      output: scanner.text(),
      cwd: this.cwd ?? '',
      timedOut,
      truncated: scanner.output.truncated,
      restarted,
      durationMs: performance.now() - started,
    };
  }

  /** Starts bash and runs an empty command (restoring the last cwd) to learn its PID and cwd. */
  private async start(): Promise<void> {
    let proc: SandboxProcess;
    try {
      proc = this.spawn(['bash', '--noprofile', '--norc']);
    } catch (err) {
      throw RolloutError.from(err, 'sandbox_error');
    }
    this.everStarted = true;
    const stderr = new CappedOutput(STDERR_KEEP);
    const stdoutClosed = new Promise<void>((resolve) => proc.stdout.once('close', resolve).once('end', resolve));
    const stderrEnded = new Promise<void>((resolve) => proc.stderr.once('close', resolve).once('end', resolve));
    const live: Live = { proc, stderr, stderrTail: Buffer.alloc(0), stderrSinceSend: 0, stderrEnded, pid: 0, done: false, throttled: false, ended: proc.exited.then((exit) => {
      live.exit = exit;
      proc.kill(); // leftovers of the shell (background jobs) would keep stdout open
      return stdoutClosed;
    }) };
    proc.stdin.on('error', () => undefined);
    proc.stdout.on('data', (chunk: Buffer) => this.onData(live, chunk));
    proc.stderr.on('data', (chunk: Buffer) => {
      stderr.push(chunk);
      const tail = Buffer.concat([live.stderrTail, chunk]);
      live.stderrTail = tail.length > STDERR_KEEP ? Buffer.from(tail.subarray(tail.length - STDERR_KEEP)) : tail;
      live.stderrSinceSend += chunk.length;
      // Only what the shell itself prints reaches this pipe: past a few kilobytes per command nothing more is read
      // until the next command (a job the shell's traps started may flood it).
      if (live.stderrSinceSend > STDERR_PER_COMMAND && this.live === live) proc.stderr.pause();
    });
    void live.ended.then(() => {
      live.done = true;
      this.wake?.();
    });
    this.live = live;
    const setup = this.cwd ? `cd -- ${shellQuote(this.cwd)} 2>/dev/null; :` : ':';
    // Output kept from the shell before (reapDead) belongs to the next command, not to the setup.
    const idle = this.idle;
    const idleBytes = this.idleBytes;
    this.idle = [];
    this.idleBytes = 0;
    const scanner = this.send(setup, 0);
    const event = await this.next(scanner, live, 30_000, undefined);
    this.idle = [...idle, ...this.idle];
    this.idleBytes += idleBytes;
    const outcome = scanner.outcome;
    if (event.kind !== 'marker' || !outcome || !('marker' in outcome) || outcome.marker.broken !== undefined) {
      await this.kill();
      throw this.options.startFailure?.(stderr.text()) ?? new RolloutError('sandbox_error', `the shell did not start: ${stderr.text().trim() || event.kind}`);
    }
    live.pid = outcome.marker.pid;
    this.finish(scanner, outcome.marker, outcome.rest);
  }

  private send(command: string, status = this.lastStatus): MarkerScanner {
    const nonce = newNonce();
    const canary = newNonce();
    const ack = newNonce();
    const scanner = new MarkerScanner(nonce, this.options.outputLimitBytes, canary, ack);
    for (const chunk of this.idle) scanner.push(chunk);
    this.idle = [];
    this.idleBytes = 0;
    this.scanner = scanner;
    if (this.live) {
      this.live.stderrSinceSend = 0;
      resume(this.live.proc);
    }
    this.live?.proc.stdin.write(frameCommand(command, status, nonce, canary, ack));
    return scanner;
  }

  private finish(scanner: MarkerScanner, marker: Marker, rest: Buffer): void {
    if (marker.cwd !== '') this.cwd = marker.cwd;
    if (this.scanner === scanner) this.scanner = undefined;
    if (rest.length > 0) this.keepIdle(rest);
  }

  private onData(live: Live, chunk: Buffer): void {
    if (this.live !== live) return;
    const scanner = this.scanner;
    if (!scanner) return this.keepIdle(chunk);
    scanner.push(chunk);
    if (scanner.outcome) this.wake?.();
    else if (scanner.output.droppedBytes > PAST_LIMIT_FREE_BYTES && !live.throttled) this.throttle(live);
  }

  /** Stops reading the shell's stdout for PAST_LIMIT_PAUSE_MS (output past the limit: see there). */
  private throttle(live: Live): void {
    live.throttled = true;
    live.proc.stdout.pause();
    setTimeout(() => {
      live.throttled = false;
      // Between commands keepIdle decides whether the shell is read; kill() resumes a dead one's pipes itself.
      if (this.live === live && (this.scanner !== undefined || this.idleBytes < this.options.outputLimitBytes)) live.proc.stdout.resume();
    }, PAST_LIMIT_PAUSE_MS);
  }

  /**
   * Keeps output that arrived between commands, up to the output limit; at the limit the shell's stdout is no longer
   * read until the next command is sent. Why: a background job printing endlessly (`yes &`) was drained and dropped
   * as fast as it wrote — most of the server's event loop, for the sandbox's whole life, while the model was not even
   * running a command. Paused, the job blocks on its full pipe, as it would on a terminal nobody reads.
   */
  private keepIdle(chunk: Buffer): void {
    const room = this.options.outputLimitBytes - this.idleBytes;
    if (room > 0) {
      const kept = chunk.length <= room ? chunk : chunk.subarray(0, room);
      this.idle.push(Buffer.from(kept));
      this.idleBytes += kept.length;
    }
    if (this.idleBytes >= this.options.outputLimitBytes && this.scanner === undefined) this.live?.proc.stdout.pause();
  }

  /** Waits for the marker, the shell's end, the timer or the abort, whichever comes first. */
  private next(scanner: MarkerScanner, live: Live, ms: number, signal: AbortSignal | undefined): Promise<Event> {
    return new Promise<Event>((resolve) => {
      if (scanner.outcome) return resolve({ kind: 'marker' });
      if (live.done) return resolve({ kind: 'ended' });
      const timer = setTimeout(() => done({ kind: 'timer' }), ms);
      const onAbort = (): void => done({ kind: 'aborted' });
      const done = (event: Event): void => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        if (this.wake === check) this.wake = undefined;
        resolve(event);
      };
      const check = (): void => {
        if (scanner.outcome) done({ kind: 'marker' });
        else if (live.done) done({ kind: 'ended' });
      };
      this.wake = check;
      if (signal?.aborted) onAbort();
      else signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Kills the shell and everything it started; waits until it is gone. */
  private async kill(): Promise<void> {
    const live = this.live;
    this.live = undefined;
    this.scanner = undefined;
    if (!live) return;
    live.proc.kill();
    resume(live.proc); // paused pipes never see their end
    await live.ended;
  }
}

/** Reads the shell's pipes again (keepIdle and the stderr cap pause them). */
function resume(proc: SandboxProcess): void {
  proc.stdout.resume();
  proc.stderr.resume();
}
