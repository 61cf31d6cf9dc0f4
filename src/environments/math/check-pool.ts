import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { RolloutError } from '../../errors.js';
import { silentLogger, type Logger } from '../../observability/logger.js';
import { threadStat } from '../../thread-priority.js';
import { MAX_TIMER_MS } from '../../timers.js';
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
  /** Replaces the worker entry (tests: a thread that crashes or never starts). */
  script?: URL;
  logger?: Logger;
}

/** USER_HZ: the unit of utime and stime in /proc (100 on every Linux the server runs on). */
const TICK_MS = 10;

interface Job {
  task: CheckTask;
  resolve: (outcome: CheckOutcome<CheckTask>) => void;
  reject: (err: RolloutError) => void;
  settled: boolean;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
}

interface Thread {
  worker: Worker;
  ready: boolean;
  /** Its Linux thread id, when it could tell (then the bound is its CPU time; else wall time). */
  tid: number | undefined;
  /** Its CPU time in ticks when it last reported (before its current job). */
  cpuTicks: number;
  job: Job | undefined;
  jobId: number;
  startedAt: number;
  timer: NodeJS.Timeout | undefined;
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
  readonly #maxQueued: number;
  readonly #script: URL;
  readonly #log: Logger;
  readonly #threads = new Set<Thread>();
  readonly #stopping = new Set<Promise<number>>();
  readonly #queue: Job[] = [];
  #nextId = 0;
  #closed = false;
  /** Checks asked for and not settled yet: while there are any the threads are ref'ed (see {@link #holdProcess}). */
  #pending = 0;
  #held = false;
  #restartDelayMs = 0;
  #restartTimer: NodeJS.Timeout | undefined;
  /** Counters for tests and logs: threads replaced after a crash, after a check past its bound. */
  readonly stats = { crashes: 0, limits: 0, inline: 0, threaded: 0 };

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
    this.#maxQueued = options.maxQueued ?? 4096;
    this.#script = options.script ?? new URL('./check-worker-entry.mjs', import.meta.url);
    this.#log = (options.logger ?? silentLogger()).child({ component: 'check-pool' });
  }

  /**
   * Runs a check (on a thread unless {@link inlineCheck} answers it). Rejects with environment_error when no thread can
   * answer (one died, none starts, the pool is closed or full), and with the abort reason when `signal` fires first.
   */
  check<T extends CheckTask>(task: T, signal?: AbortSignal): Promise<CheckOutcome<T>> {
    const inline = inlineCheck(task);
    if (inline !== undefined) {
      this.stats.inline++;
      return Promise.resolve({ result: inline });
    }
    if (this.#closed) return Promise.reject(new RolloutError('environment_error', 'the answer checker threads are shut down'));
    if (signal?.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    if (this.#queue.length >= this.#maxQueued) {
      return Promise.reject(new RolloutError('environment_error', `the answer checker's queue is full (${this.#maxQueued} checks waiting)`));
    }
    this.stats.threaded++;
    return new Promise<CheckOutcome<T>>((resolve, reject) => {
      const job: Job = { task, resolve: resolve as Job['resolve'], reject, settled: false, signal, onAbort: undefined };
      this.#pending++;
      this.#holdProcess();
      if (signal) {
        // The caller stops waiting; a running check goes on under its bound (checks are short, a new thread is not free).
        job.onAbort = () => {
          const at = this.#queue.indexOf(job);
          if (at >= 0) this.#queue.splice(at, 1);
          this.#settle(job, () => reject(RolloutError.from(signal.reason, 'cancelled')));
        };
        signal.addEventListener('abort', job.onAbort, { once: true });
      }
      this.#queue.push(job);
      this.#startThreads();
      this.#dispatch();
    });
  }

  /** Fails waiting and running checks (environment_error) and terminates every thread. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#restartTimer);
    const stopping = new RolloutError('environment_error', 'the answer checker threads are shutting down');
    for (const job of this.#queue.splice(0)) this.#settle(job, () => job.reject(stopping));
    const threads = [...this.#threads];
    this.#threads.clear();
    for (const t of threads) if (t.job) this.#finish(t, (job) => job.reject(stopping));
    await Promise.all([...threads.map((t) => t.worker.terminate()), ...this.#stopping]);
  }

  /** The threads' ids (worker threadId), for tests: which thread a check may run on. */
  threadIds(): number[] {
    return [...this.#threads].map((t) => t.worker.threadId);
  }

  #startThreads(): void {
    if (this.#closed || this.#restartTimer !== undefined) return; // after a failed start, the timer starts the next one
    while (this.#threads.size < this.size) this.#spawn();
  }

  #spawn(): void {
    const worker = new Worker(this.#script);
    const thread: Thread = { worker, ready: false, tid: undefined, cpuTicks: 0, job: undefined, jobId: -1, startedAt: 0, timer: undefined };
    this.#threads.add(thread);
    worker.on('message', (reply: CheckWorkerReply) => this.#onReply(thread, reply));
    worker.on('error', (err) => this.#log.error({ err }, 'answer checker thread failed'));
    worker.on('exit', (code) => this.#onExit(thread, code));
    // After the listeners: adding a 'message' listener refs the worker's port again (Node 20), which undid an unref
    // made before it (a pool nobody closed kept its process alive: `serve --math-checker` did not exit on SIGTERM).
    if (!this.#held) worker.unref();
  }

  /**
   * Threads keep the process alive while a check waits or runs, and only then: a script awaiting a check must not end
   * before it (Node ends a process whose only work is an unref'ed thread's, exit code 13 for a pending top-level
   * await), and an idle pool nobody closed must not keep its process.
   */
  #holdProcess(): void {
    const hold = this.#pending > 0;
    if (hold === this.#held) return;
    this.#held = hold;
    for (const t of this.#threads) {
      if (hold) t.worker.ref();
      else t.worker.unref();
    }
  }

  #onReply(thread: Thread, reply: CheckWorkerReply): void {
    if (!this.#threads.has(thread)) return; // let go (replaced or closed): a late answer is not used
    if (reply.cpuTicks !== undefined) thread.cpuTicks = reply.cpuTicks;
    if (reply.type === 'ready') {
      thread.ready = true;
      thread.tid = reply.tid;
      this.#restartDelayMs = 0;
      this.#dispatch();
      return;
    }
    if (thread.job === undefined || reply.id !== thread.jobId) return;
    this.#finish(thread, (job) =>
      reply.type === 'result'
        ? job.resolve({ result: reply.result as CheckResult })
        : job.reject(new RolloutError('environment_error', `the answer checker failed: ${reply.message}`)),
    );
    this.#dispatch();
  }

  #onExit(thread: Thread, code: number): void {
    if (!this.#threads.delete(thread)) return; // closed, or already let go
    this.stats.crashes++;
    if (!thread.ready) {
      // Died while loading: a replacement would most likely die the same way; retried after a pause, and what waits fails now.
      const err = new RolloutError('environment_error', `the answer checker thread could not start (exit code ${code})`);
      this.#log.error({ code }, 'answer checker thread could not start');
      if (![...this.#threads].some((t) => t.ready)) for (const job of this.#queue.splice(0)) this.#settle(job, () => job.reject(err));
      this.#restartLater();
      return;
    }
    this.#log.error({ code, busy: thread.job !== undefined }, 'answer checker thread exited; replacing it');
    if (thread.job) this.#finish(thread, (job) => job.reject(new RolloutError('environment_error', `the answer checker thread exited with code ${code} during this check; it was replaced`)));
    this.#startThreads();
    this.#dispatch();
  }

  #restartLater(): void {
    if (this.#closed || this.#restartTimer !== undefined) return;
    this.#restartDelayMs = Math.min(30_000, Math.max(500, this.#restartDelayMs * 2));
    this.#restartTimer = setTimeout(() => {
      this.#restartTimer = undefined;
      if (!this.#closed && this.#threads.size < this.size) this.#spawn();
    }, this.#restartDelayMs);
    this.#restartTimer.unref();
  }

  #dispatch(): void {
    for (const thread of this.#threads) {
      if (this.#queue.length === 0) return;
      if (!thread.ready || thread.job) continue;
      const job = this.#queue.shift()!;
      thread.job = job;
      thread.jobId = this.#nextId++;
      thread.startedAt = Date.now();
      this.#arm(thread, this.checkCpuMs);
      thread.worker.postMessage({ id: thread.jobId, task: job.task });
    }
  }

  #arm(thread: Thread, ms: number): void {
    clearTimeout(thread.timer);
    thread.timer = setTimeout(() => this.#overtime(thread), ms);
    thread.timer.unref();
  }

  /** The check has run `checkCpuMs` of wall time (or more): past its CPU bound it ends as a limit; starved, it waits on. */
  #overtime(thread: Thread): void {
    if (!this.#threads.has(thread) || thread.job === undefined) return;
    const wallMs = Date.now() - thread.startedAt;
    const stat = thread.tid === undefined ? undefined : threadStat(thread.tid);
    const cpuMs = stat === undefined ? wallMs : (Number(stat[11]) + Number(stat[12]) - thread.cpuTicks) * TICK_MS;
    if (cpuMs >= this.checkCpuMs) {
      this.stats.limits++;
      this.#log.warn({ cpuMs, wallMs }, 'answer check past its CPU bound; replacing its thread');
      this.#replace(thread, (job) => job.resolve({ limit: `no verdict within ${this.checkCpuMs} ms of CPU time` }));
    } else if (wallMs >= this.starvedAfterMs) {
      this.#log.error({ cpuMs, wallMs }, 'answer checker thread starved or blocked; replacing it');
      const err = new RolloutError('environment_error', `the answer checker thread got ${cpuMs} ms of CPU in ${wallMs} ms (starved or blocked); it was replaced`);
      this.#replace(thread, (job) => job.reject(err));
    } else {
      this.#arm(thread, Math.max(100, Math.min(this.checkCpuMs - cpuMs, this.starvedAfterMs - wallMs)));
    }
  }

  /** Settles the thread's job, terminates the thread (stuck in a loop, it reads no message) and starts another. */
  #replace(thread: Thread, settle: (job: Job) => void): void {
    this.#finish(thread, settle);
    this.#threads.delete(thread);
    const stopped = thread.worker.terminate();
    this.#stopping.add(stopped);
    void stopped.finally(() => this.#stopping.delete(stopped));
    this.#startThreads();
    this.#dispatch();
  }

  #finish(thread: Thread, settle: (job: Job) => void): void {
    const job = thread.job!;
    thread.job = undefined;
    clearTimeout(thread.timer);
    thread.timer = undefined;
    this.#settle(job, () => settle(job));
  }

  #settle(job: Job, settle: () => void): void {
    if (job.settled) return;
    job.settled = true;
    this.#pending--;
    this.#holdProcess();
    if (job.onAbort) job.signal?.removeEventListener('abort', job.onAbort);
    job.onAbort = undefined;
    settle();
  }
}

let shared: CheckPool | undefined;

/**
 * The pool of environments built without one (`createMathEnvironment()` in a script or test): created on first use,
 * never closed (its threads are unref'ed). A server builds and closes its own (app.ts).
 */
export function sharedCheckPool(): CheckPool {
  shared ??= new CheckPool();
  return shared;
}

