import { availableParallelism } from 'node:os';
import { RolloutError } from '../../errors.js';
import { silentLogger, type Logger } from '../../observability/logger.js';
import { threadStat } from '../../thread-priority.js';
import { MAX_TIMER_MS, timerOption } from '../../timers.js';
import { ThreadPool, type PoolThread, type ThreadPoolSpec, type ThreadReply } from '../../workers/thread-pool.js';
import { inlineCheck, type CheckResult, type CheckTask } from './check-tasks.js';

/** What a checker thread answers (check-worker.ts speaks it); `cpuTicks` is its CPU time so far (Linux), for the bound. */
export type CheckWorkerReply =
  | { type: 'ready'; tid?: number; cpuTicks?: number }
  | { type: 'result'; id: number; result: unknown; cpuTicks?: number }
  | { type: 'error'; id: number; message: string; cpuTicks?: number };

/** How a check ended: its verdict, or `limit` (why there is none) when it ran past the pool's bound: the answer's doing. */
export type CheckOutcome<T extends CheckTask> = { result: CheckResult<T> } | { limit: string };

export interface CheckPoolOptions {
  /** Threads (default: one per core left to the event loop, 1 or 2: checks are short, these only keep them off it). */
  size?: number;
  /** Checks waiting for a thread beyond which more are refused (environment_error). Default 4096. */
  maxQueued?: number;
  /** CPU time one check may take on its thread, ms (default 5 s); past it the check has no verdict (`limit`) and the thread is replaced. */
  checkCpuMs?: number;
  /**
   * Wall time after which a check still under its CPU bound fails as environment_error (its thread starved of a core or
   * blocked) and its thread is replaced, ms. Default 10 × `checkCpuMs`.
   */
  starvedAfterMs?: number;
  /**
   * Longest a thread may take to start before it is terminated and the start fails (environment_error, retried after
   * a pause), ms; 0 = none. Default 60 s: a start takes well under a second here.
   */
  startTimeoutMs?: number;
  /** Replaces the worker entry (tests: a thread that crashes or never starts). */
  script?: URL;
  logger?: Logger;
}

/** USER_HZ: the unit of utime and stime in /proc (100 on every Linux the server runs on). */
const TICK_MS = 10;

/** A checker thread's own state: its Linux thread id, when it could tell (then the bound is its CPU time; else wall
 * time), and its CPU time in ticks when it last reported (before its current check). */
interface CheckThread {
  tid: number | undefined;
  cpuTicks: number;
}

/** One thread per core left to the event loop, at least 1 and at most 2. */
export function defaultCheckWorkers(): number {
  return Math.max(1, Math.min(2, availableParallelism() - 1));
}

/**
 * The built-in answer checkers' threads (math equivalence, STEM quantities and choices; see check-tasks.ts), so that a
 * hostile answer never blocks the event loop that serves every trainer's stream: measured, a 600-character set of
 * powers costs the inline checker ~60 ms, up to 360 ms with an adversarial reference, all of it a stalled event loop.
 * Checks whose answer needs no parsing ({@link inlineCheck}: empty, identical plain text, over the length bound) stay
 * inline: a thread's round trip (~0.1 ms) would cost more than they do.
 *
 * Bound: a check may take `checkCpuMs` of its thread's CPU time (read from /proc on Linux; wall time elsewhere). Past
 * it the check ends as `{ limit }` (the environment's reward 0 with `checker_limit`) and the thread is terminated and
 * replaced — the only way back from a thread stuck in a loop. CPU, not wall time, because the threads run below the
 * event loop's priority: on a loaded machine an honest check can wait long for a core, and that is not the answer's
 * doing. A thread still under its CPU bound after `starvedAfterMs` of wall time is starved or blocked: an
 * infrastructure failure (environment_error), also replaced. So is a thread that dies, or cannot start (never reward 0).
 *
 * Threads start with the first check and are unref'ed (a pool nobody closed keeps no process alive); `close()` (the
 * server's shutdown) fails what waits or runs and terminates them. Work is bounded by the callers: the eval stage's
 * concurrency bounds the checks in flight, and `maxQueued` refuses beyond it.
 */
export class CheckPool {
  readonly size: number;
  readonly checkCpuMs: number;
  readonly starvedAfterMs: number;
  readonly #log: Logger;
  readonly #pool: ThreadPool<CheckTask, CheckOutcome<CheckTask>, CheckWorkerReply, CheckThread>;
  #limits = 0;
  #inline = 0;

  constructor(options: CheckPoolOptions = {}) {
    this.size = options.size ?? defaultCheckWorkers();
    if (!Number.isInteger(this.size) || this.size < 1) throw RolloutError.invalid('size', `must be a positive integer, got ${this.size}`);
    this.checkCpuMs = options.checkCpuMs ?? 5_000;
    if (!Number.isInteger(this.checkCpuMs) || this.checkCpuMs < 1 || this.checkCpuMs > MAX_TIMER_MS) {
      throw RolloutError.invalid('checkCpuMs', `must be a whole number of ms from 1 to ${MAX_TIMER_MS}, got ${this.checkCpuMs}`);
    }
    this.starvedAfterMs = options.starvedAfterMs ?? Math.min(MAX_TIMER_MS, this.checkCpuMs * 10);
    if (!Number.isInteger(this.starvedAfterMs) || this.starvedAfterMs < this.checkCpuMs) {
      throw RolloutError.invalid('starvedAfterMs', `must be a whole number of ms, at least checkCpuMs (${this.checkCpuMs}), got ${this.starvedAfterMs}`);
    }
    this.#log = (options.logger ?? silentLogger()).child({ component: 'check-pool' });
    this.#pool = new ThreadPool<CheckTask, CheckOutcome<CheckTask>, CheckWorkerReply, CheckThread>({
      script: options.script ?? new URL('./check-worker-entry.mjs', import.meta.url),
      size: this.size,
      maxQueued: options.maxQueued ?? 4096,
      log: this.#log,
      threadName: 'answer checker thread',
      errors: CHECK_POOL_ERRORS,
      threadState: () => ({ tid: undefined, cpuTicks: 0 }),
      observe: (thread, reply) => {
        if (reply.cpuTicks !== undefined) thread.state.cpuTicks = reply.cpuTicks;
        if (reply.type === 'ready') thread.state.tid = reply.tid;
      },
      result: (reply) => ({ result: reply.result as CheckResult }),
      taskError: (reply) => new RolloutError('environment_error', `the answer checker failed: ${reply.message}`),
      ...(options.startTimeoutMs !== undefined && { startTimeoutMs: timerOption('startTimeoutMs', options.startTimeoutMs) }),
      // The bound is checked first after checkCpuMs of wall time: a check cannot have used more CPU than that.
      timerMs: this.checkCpuMs,
      // No abandonedTaskGraceMs: a check its caller gave up goes on under its bound (checks are short, a new thread is not free).
      overtime: (thread) => this.#overtime(thread),
    });
  }

  /** Counters for tests and logs: threads replaced after a crash, checks past their bound, checks inline and on threads. */
  get stats(): { crashes: number; limits: number; inline: number; threaded: number } {
    return { crashes: this.#pool.crashes, limits: this.#limits, inline: this.#inline, threaded: this.#pool.accepted };
  }

  /**
   * Runs a check (on a thread unless {@link inlineCheck} answers it). Rejects with environment_error when no thread can
   * answer (one died, none starts, the pool is closed or full), and with the abort reason when `signal` fires first.
   */
  check<T extends CheckTask>(task: T, signal?: AbortSignal): Promise<CheckOutcome<T>> {
    const inline = inlineCheck(task);
    if (inline !== undefined) {
      this.#inline++;
      return Promise.resolve({ result: inline });
    }
    return this.#pool.run(task, signal) as Promise<CheckOutcome<T>>;
  }

  /** Fails waiting and running checks (environment_error) and terminates every thread. */
  close(): Promise<void> {
    return this.#pool.close();
  }

  /** The threads' ids (worker threadId), for tests: which thread a check may run on. */
  threadIds(): number[] {
    return this.#pool.threadIds();
  }

  /** The check has run `checkCpuMs` of wall time (or more): past its CPU bound it ends as a limit; starved, it waits on. */
  #overtime(thread: PoolThread<CheckThread>): void {
    const wallMs = Date.now() - thread.startedAt;
    const stat = thread.state.tid === undefined ? undefined : threadStat(thread.state.tid);
    const cpuMs = stat === undefined ? wallMs : (Number(stat[11]) + Number(stat[12]) - thread.state.cpuTicks) * TICK_MS;
    if (cpuMs >= this.checkCpuMs) {
      this.#limits++;
      this.#log.warn({ cpuMs, wallMs }, 'answer check past its CPU bound; replacing its thread');
      this.#pool.replace(thread, { result: { limit: `no verdict within ${this.checkCpuMs} ms of CPU time` } });
    } else if (wallMs >= this.starvedAfterMs) {
      this.#log.error({ cpuMs, wallMs }, 'answer checker thread starved or blocked; replacing it');
      const error = new RolloutError('environment_error', `the answer checker thread got ${cpuMs} ms of CPU in ${wallMs} ms (starved or blocked); it was replaced`);
      this.#pool.replace(thread, { error });
    } else {
      this.#pool.arm(thread, Math.max(100, Math.min(this.checkCpuMs - cpuMs, this.starvedAfterMs - wallMs)));
    }
  }
}

/** The checkers' errors: whatever keeps a check from its verdict is the infrastructure's (environment_error), never reward 0. */
const CHECK_POOL_ERRORS: ThreadPoolSpec<unknown, ThreadReply, unknown>['errors'] = {
  closed: () => new RolloutError('environment_error', 'the answer checker threads are shut down'),
  shuttingDown: () => new RolloutError('environment_error', 'the answer checker threads are shutting down'),
  queueFull: (max) => new RolloutError('environment_error', `the answer checker's queue is full (${max} checks waiting)`),
  couldNotStart: (cause) =>
    new RolloutError(
      'environment_error',
      'message' in cause
        ? `the answer checker thread could not start: ${cause.message}`
        : 'code' in cause
          ? `the answer checker thread could not start (exit code ${cause.code})`
          : `the answer checker thread could not start: it did not become ready within ${cause.timeoutMs} ms; it was terminated`,
    ),
  exited: (code) => new RolloutError('environment_error', `the answer checker thread exited with code ${code} during this check; it was replaced`),
  unsendable: (err) =>
    new RolloutError('environment_error', `the check could not be sent to its thread: ${err instanceof Error ? err.message : String(err)}`, { cause: err }),
};

let shared: CheckPool | undefined;

/**
 * The pool of environments built without one (`createMathEnvironment()` in a script or test): created on first use,
 * never closed (its threads are unref'ed). A server builds and closes its own (app.ts).
 */
export function sharedCheckPool(): CheckPool {
  shared ??= new CheckPool();
  return shared;
}

