import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { RolloutError, type ErrorCode } from '../errors.js';
import { silentLogger, type Logger } from '../observability/logger.js';

/** What a worker script receives and answers (token-worker.ts speaks it). */
export type WorkerRequest<Task> = { id: number; task: Task };
export type WorkerReply<Result> =
  | { type: 'ready' }
  | { type: 'init-error'; message: string }
  | { type: 'result'; id: number; result: Result }
  | { type: 'error'; id: number; code: ErrorCode; message: string; field?: string };

/** Options of {@link TokenPool}. */
export interface TokenPoolOptions {
  /** Worker entry (an ES module run in each thread); it must answer {@link WorkerReply}s. */
  script: URL;
  /** Given to every worker as `workerData` (structured clone): e.g. which model folder to load. */
  workerData?: unknown;
  /** Threads. Default {@link defaultTokenWorkers}. */
  size?: number;
  /** Tasks waiting for a thread beyond which `run` refuses more (resource_exhausted). Default 4096. */
  maxQueued?: number;
  logger?: Logger;
}

/** Counters of a pool, for metrics and tests. */
export interface TokenPoolStats {
  /** Threads alive (starting or ready). */
  workers: number;
  busy: number;
  queued: number;
  completed: number;
  /** Threads that died while the pool was open (each replaced). */
  crashes: number;
}

/** One thread per core left to the event loop, at least 1 and at most 4 (tokenizing is the only work they do). */
export function defaultTokenWorkers(): number {
  return Math.max(1, Math.min(4, availableParallelism() - 1));
}

interface Job<Task, Result> {
  task: Task;
  resolve: (result: Result) => void;
  reject: (err: RolloutError) => void;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
}

interface Thread<Task, Result> {
  worker: Worker;
  ready: boolean;
  job: Job<Task, Result> | undefined;
  jobId: number;
}

/**
 * A fixed-size pool of worker threads for CPU work that must not block the event loop (rendering and tokenizing
 * long conversations: ~2 µs per token, so 100 ms for a 64K-token prompt). Each thread does one task at a time;
 * tasks wait in a bounded FIFO queue.
 *
 * Failure model: a task that throws in its thread rejects with the same RolloutError code and message (so a
 * template's invalid_argument stays one); a thread that dies (crash, out of memory, `process.exit`) fails only the
 * task it was running, with `internal` "token worker exited", and is replaced — queued tasks go to the others or
 * to the replacement. A thread that cannot even start (its init failed) fails the queued tasks and is retried after
 * a pause, so a broken model folder cannot spin. `close()` refuses new tasks, fails waiting and running ones with
 * `unavailable` and terminates every thread (the server's shutdown awaits it: no thread outlives the server).
 *
 * Threads start with the first task (or `ready()`), so a server whose token work all fits inline never pays for
 * loading the tokenizer again; they are unref'ed, so a pool nobody closed does not keep the process alive.
 *
 * @example
 * const pool = new TokenPool<Task, Result>({ script: new URL('./token-worker-entry.mjs', import.meta.url), workerData });
 * await pool.ready();
 * const result = await pool.run(task, signal);
 * await pool.close();
 */
export class TokenPool<Task, Result> {
  readonly size: number;
  readonly #options: TokenPoolOptions;
  readonly #maxQueued: number;
  readonly #log: Logger;
  readonly #threads = new Set<Thread<Task, Result>>();
  /** Threads being terminated after a failed start: close() waits for them too. */
  readonly #stopping = new Set<Promise<number>>();
  readonly #queue: Job<Task, Result>[] = [];
  #nextId = 0;
  #closed = false;
  #completed = 0;
  #crashes = 0;
  #restartDelayMs = 0;
  #readyWaiters: { resolve: () => void; reject: (err: RolloutError) => void }[] = [];
  #restartTimer: NodeJS.Timeout | undefined;

  constructor(options: TokenPoolOptions) {
    this.#options = options;
    this.size = options.size ?? defaultTokenWorkers();
    if (!Number.isInteger(this.size) || this.size < 1) throw RolloutError.invalid('tokenWorkers.count', `must be a positive integer, got ${this.size}`);
    this.#maxQueued = options.maxQueued ?? 4096;
    this.#log = (options.logger ?? silentLogger()).child({ component: 'token-pool' });
  }

  /** Starts every thread and resolves when each has loaded (e.g. its tokenizer); rejects if one could not. */
  ready(): Promise<void> {
    if (this.#closed) return Promise.reject(new RolloutError('unavailable', 'token workers are shut down'));
    this.#startThreads();
    if ([...this.#threads].every((t) => t.ready) && this.#threads.size === this.size) return Promise.resolve();
    return new Promise((resolve, reject) => this.#readyWaiters.push({ resolve, reject }));
  }

  stats(): TokenPoolStats {
    let busy = 0;
    for (const t of this.#threads) if (t.job) busy++;
    return { workers: this.#threads.size, busy, queued: this.#queue.length, completed: this.#completed, crashes: this.#crashes };
  }

  /**
   * Runs a task on a thread. An abort of `signal` while the task waits removes it; while it runs, the caller gets
   * the abort at once and the thread's answer is dropped.
   */
  run(task: Task, signal?: AbortSignal): Promise<Result> {
    if (this.#closed) return Promise.reject(new RolloutError('unavailable', 'token workers are shut down'));
    if (signal?.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    if (this.#queue.length >= this.#maxQueued) {
      return Promise.reject(new RolloutError('resource_exhausted', `token work queue is full (${this.#maxQueued} tasks waiting)`));
    }
    return new Promise<Result>((resolve, reject) => {
      const job: Job<Task, Result> = { task, resolve, reject, signal, onAbort: undefined };
      if (signal) {
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

  /** Fails waiting and running tasks with `unavailable` and terminates every thread. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#restartTimer);
    const stopping = new RolloutError('unavailable', 'token workers are shutting down');
    for (const job of this.#queue.splice(0)) this.#settle(job, () => job.reject(stopping));
    const threads = [...this.#threads];
    this.#threads.clear();
    for (const t of threads) if (t.job) this.#finish(t, (job) => job.reject(stopping));
    for (const w of this.#readyWaiters.splice(0)) w.reject(stopping);
    await Promise.all([...threads.map((t) => t.worker.terminate()), ...this.#stopping]);
  }

  #startThreads(): void {
    if (this.#restartTimer !== undefined) return; // after an init failure, the timer starts the next one
    while (this.#threads.size < this.size) this.#spawn();
  }

  #spawn(): void {
    const worker = new Worker(this.#options.script, { workerData: this.#options.workerData });
    worker.unref();
    const thread: Thread<Task, Result> = { worker, ready: false, job: undefined, jobId: -1 };
    this.#threads.add(thread);
    worker.on('message', (reply: WorkerReply<Result>) => this.#onReply(thread, reply));
    // An uncaught exception in the thread: 'exit' follows, where the thread is replaced.
    worker.on('error', (err) => this.#log.error({ err }, 'token worker failed'));
    worker.on('exit', (code) => this.#onExit(thread, code));
  }

  #onReply(thread: Thread<Task, Result>, reply: WorkerReply<Result>): void {
    switch (reply.type) {
      case 'ready':
        thread.ready = true;
        this.#restartDelayMs = 0;
        if ([...this.#threads].every((t) => t.ready)) for (const w of this.#readyWaiters.splice(0)) w.resolve();
        this.#dispatch();
        return;
      case 'init-error': {
        const err = new RolloutError('failed_precondition', `token worker could not start: ${reply.message}`);
        this.#log.error({ err }, 'token worker could not start');
        for (const w of this.#readyWaiters.splice(0)) w.reject(err);
        // Nothing can run until a thread starts: the waiting tasks fail now rather than at their deadlines.
        if (![...this.#threads].some((t) => t.ready)) for (const job of this.#queue.splice(0)) this.#settle(job, () => job.reject(err));
        this.#threads.delete(thread);
        const stopped = thread.worker.terminate();
        this.#stopping.add(stopped);
        void stopped.finally(() => this.#stopping.delete(stopped));
        this.#restartLater();
        return;
      }
      case 'result':
      case 'error':
        if (thread.job === undefined || reply.id !== thread.jobId) return;
        this.#completed++;
        this.#finish(thread, (job) =>
          reply.type === 'result'
            ? job.resolve(reply.result)
            : job.reject(new RolloutError(reply.code, reply.message, reply.field === undefined ? {} : { field: reply.field })),
        );
        this.#dispatch();
    }
  }

  #onExit(thread: Thread<Task, Result>, code: number): void {
    if (!this.#threads.delete(thread)) return; // closed, or already replaced after an init error
    this.#crashes++;
    const err = new RolloutError('internal', `token worker exited with code ${code} while working on this sample; the pool replaced it`);
    this.#log.error({ code, busy: thread.job !== undefined }, 'token worker exited; replacing it');
    if (thread.job) this.#finish(thread, (job) => job.reject(err));
    this.#spawn();
  }

  #restartLater(): void {
    if (this.#closed) return;
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
      thread.worker.postMessage({ id: thread.jobId, task: job.task } satisfies WorkerRequest<Task>);
    }
  }

  /** Takes the thread's job off it and settles the job (unless its caller already gave up). */
  #finish(thread: Thread<Task, Result>, settle: (job: Job<Task, Result>) => void): void {
    const job = thread.job!;
    thread.job = undefined;
    this.#settle(job, () => settle(job));
  }

  #settle(job: Job<Task, Result>, settle: () => void): void {
    if (job.onAbort) job.signal?.removeEventListener('abort', job.onAbort);
    job.onAbort = undefined;
    settle();
  }
}
