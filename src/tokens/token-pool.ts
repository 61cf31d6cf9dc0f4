import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { RolloutError, type ErrorCode } from '../errors.js';
import { silentLogger, type Logger } from '../observability/logger.js';
import { MAX_TIMER_MS } from '../timers.js';

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
  /**
   * Longest a task may run on its thread, ms; past it the task fails (`internal`) and the thread is stopped and
   * replaced, so a task stuck in a pathological render or a library bug cannot hold a thread forever. 0 = none.
   * Default 60 s: a 64K-token prompt takes ~100 ms, a template probe under 1 s.
   */
  taskTimeoutMs?: number;
  /**
   * How long a thread may go on with a task its caller gave up (aborted) before it is stopped and replaced, ms
   * (0: at once). Default 1 s rather than 0: a new thread loads the tokenizer again (seconds of CPU), while most
   * tasks end well within a second, so a cancelled sample does not cost a reload.
   */
  abandonedTaskGraceMs?: number;
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
  /** Threads the pool stopped because their task overran `taskTimeoutMs`, or was given up and did not end (each replaced). */
  reclaimed: number;
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
  /** The thread running it; undefined while it waits. */
  thread: Thread<Task, Result> | undefined;
  /** Its promise is settled (a caller that gave up is not answered again). */
  settled: boolean;
}

interface Thread<Task, Result> {
  worker: Worker;
  ready: boolean;
  job: Job<Task, Result> | undefined;
  jobId: number;
  /** When the job's deadline (taskTimeoutMs) passes, ms since the epoch; Infinity without one. */
  deadlineAt: number;
  /** Stops the thread when its job overruns (or, once given up, outlasts its grace). */
  deadline: NodeJS.Timeout | undefined;
}


/**
 * A fixed-size pool of worker threads for CPU work that must not block the event loop (rendering and tokenizing
 * long conversations: ~2 µs per token, so 100 ms for a 64K-token prompt). Each thread does one task at a time;
 * tasks wait in a bounded FIFO queue.
 *
 * Failure model: a task that throws in its thread rejects with the same RolloutError code and message (so a
 * template's invalid_argument stays one); a thread that dies (crash, out of memory, `process.exit`) fails only the
 * task it was running, with `internal` "token worker exited", and is replaced — queued tasks go to the others or
 * to the replacement. A thread stuck in a task is stopped (`worker.terminate()`) and replaced the same way: when the
 * task overruns `taskTimeoutMs` (it fails with `internal`), or when its caller gave it up and it has not ended
 * within `abandonedTaskGraceMs`; without this, as many stuck tasks as threads would leave every later task waiting
 * until its caller's own deadline. A thread that cannot even start (its init failed, or it exited before it was
 * ready) fails the queued tasks and is retried after a pause, so a broken model folder cannot spin. `close()`
 * refuses new tasks, fails waiting and running ones with `unavailable` and terminates every thread (the server's
 * shutdown awaits it: no thread outlives the server).
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
  /** How long a thread may stay on one task, and on one its caller gave up, before it is replaced (0: no limit). */
  get deadlines(): { taskTimeoutMs: number; abandonedTaskGraceMs: number } {
    return { taskTimeoutMs: this.#taskTimeoutMs, abandonedTaskGraceMs: this.#abandonedGraceMs };
  }
  readonly #options: TokenPoolOptions;
  readonly #maxQueued: number;
  readonly #taskTimeoutMs: number;
  readonly #abandonedGraceMs: number;
  readonly #log: Logger;
  readonly #threads = new Set<Thread<Task, Result>>();
  /** Threads being terminated after a failed start or a stuck task: close() waits for them too. */
  readonly #stopping = new Set<Promise<number>>();
  readonly #queue: Job<Task, Result>[] = [];
  #nextId = 0;
  #closed = false;
  #completed = 0;
  #crashes = 0;
  #reclaimed = 0;
  #restartDelayMs = 0;
  #readyWaiters: { resolve: () => void; reject: (err: RolloutError) => void }[] = [];
  /** Tasks asked for and not settled yet: while there are any (or ready() waiters) the threads are ref'ed. */
  #pending = 0;
  #held = false;
  #restartTimer: NodeJS.Timeout | undefined;

  constructor(options: TokenPoolOptions) {
    this.#options = options;
    this.size = options.size ?? defaultTokenWorkers();
    if (!Number.isInteger(this.size) || this.size < 1) throw RolloutError.invalid('tokenWorkers.count', `must be a positive integer, got ${this.size}`);
    this.#maxQueued = options.maxQueued ?? 4096;
    this.#taskTimeoutMs = timerOption('taskTimeoutMs', options.taskTimeoutMs ?? 60_000);
    this.#abandonedGraceMs = timerOption('abandonedTaskGraceMs', options.abandonedTaskGraceMs ?? 1_000);
    this.#log = (options.logger ?? silentLogger()).child({ component: 'token-pool' });
  }

  /** Starts every thread and resolves when each has loaded (e.g. its tokenizer); rejects if one could not. */
  ready(): Promise<void> {
    if (this.#closed) return Promise.reject(new RolloutError('unavailable', 'token workers are shut down'));
    this.#startThreads();
    if ([...this.#threads].every((t) => t.ready) && this.#threads.size === this.size) return Promise.resolve();
    return new Promise((resolve, reject) => {
      this.#readyWaiters.push({ resolve, reject });
      this.#holdProcess();
    });
  }

  stats(): TokenPoolStats {
    let busy = 0;
    for (const t of this.#threads) if (t.job) busy++;
    return { workers: this.#threads.size, busy, queued: this.#queue.length, completed: this.#completed, crashes: this.#crashes, reclaimed: this.#reclaimed };
  }

  /**
   * Runs a task on a thread. An abort of `signal` while the task waits removes it; while it runs, the caller gets
   * the abort at once, the thread's answer is dropped, and a thread still on it after `abandonedTaskGraceMs` is
   * replaced.
   */
  run(task: Task, signal?: AbortSignal): Promise<Result> {
    if (this.#closed) return Promise.reject(new RolloutError('unavailable', 'token workers are shut down'));
    if (signal?.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    if (this.#queue.length >= this.#maxQueued) {
      return Promise.reject(new RolloutError('resource_exhausted', `token work queue is full (${this.#maxQueued} tasks waiting)`));
    }
    return new Promise<Result>((resolve, reject) => {
      const job: Job<Task, Result> = { task, resolve, reject, signal, onAbort: undefined, thread: undefined, settled: false };
      this.#pending++;
      this.#holdProcess();
      if (signal) {
        job.onAbort = () => {
          const at = this.#queue.indexOf(job);
          if (at >= 0) this.#queue.splice(at, 1);
          this.#settle(job, () => reject(RolloutError.from(signal.reason, 'cancelled')));
          if (job.thread) this.#abandon(job.thread);
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
    this.#holdProcess();
    await Promise.all([...threads.map((t) => t.worker.terminate()), ...this.#stopping]);
  }

  #startThreads(): void {
    if (this.#restartTimer !== undefined) return; // after an init failure, the timer starts the next one
    while (this.#threads.size < this.size) this.#spawn();
  }

  #spawn(): void {
    const worker = new Worker(this.#options.script, { workerData: this.#options.workerData });
    const thread: Thread<Task, Result> = { worker, ready: false, job: undefined, jobId: -1, deadlineAt: Infinity, deadline: undefined };
    this.#threads.add(thread);
    worker.on('message', (reply: WorkerReply<Result>) => this.#onReply(thread, reply));
    // An uncaught exception in the thread: 'exit' follows, where the thread is replaced.
    worker.on('error', (err) => this.#log.error({ err }, 'token worker failed'));
    worker.on('exit', (code) => this.#onExit(thread, code));
    // After the listeners: adding a 'message' listener refs the worker's port again (Node 20), which undid an unref
    // made before it (a pool nobody closed kept its process alive).
    if (!this.#held) worker.unref();
  }

  /**
   * Threads keep the process alive while a task or a ready() waits, and only then: a script awaiting one must not end
   * before it (Node ends a process whose only work is an unref'ed thread's), and an idle pool nobody closed must not
   * keep its process.
   */
  #holdProcess(): void {
    const hold = this.#pending > 0 || this.#readyWaiters.length > 0;
    if (hold === this.#held) return;
    this.#held = hold;
    for (const t of this.#threads) {
      if (hold) t.worker.ref();
      else t.worker.unref();
    }
  }

  #onReply(thread: Thread<Task, Result>, reply: WorkerReply<Result>): void {
    // A thread the pool let go (stopped, or failed to start) may still have answered on its way out: not to be used.
    if (!this.#threads.has(thread)) return;
    switch (reply.type) {
      case 'ready':
        thread.ready = true;
        this.#restartDelayMs = 0;
        if ([...this.#threads].every((t) => t.ready)) for (const w of this.#readyWaiters.splice(0)) w.resolve();
        this.#holdProcess();
        this.#dispatch();
        return;
      case 'init-error':
        this.#retire(thread);
        this.#startFailed(new RolloutError('failed_precondition', `token worker could not start: ${reply.message}`));
        return;
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
    if (!this.#threads.delete(thread)) return; // closed, or already let go (init error, stuck task)
    this.#crashes++;
    if (!thread.ready) {
      // Died while loading (e.g. out of memory on the model folder): a replacement would most likely die the same
      // way, so this is a failed start, with its back-off, not a crash to replace at once (that spun in a loop).
      this.#startFailed(new RolloutError('failed_precondition', `token worker could not start: it exited with code ${code} while loading`));
      return;
    }
    const err = new RolloutError('internal', `token worker exited with code ${code} while working on this sample; the pool replaced it`);
    this.#log.error({ code, busy: thread.job !== undefined }, 'token worker exited; replacing it');
    if (thread.job) this.#finish(thread, (job) => job.reject(err));
    this.#spawn();
  }

  /** A thread could not start (already out of the pool): fails who waits on it and retries after a pause. */
  #startFailed(err: RolloutError): void {
    this.#log.error({ err }, 'token worker could not start');
    for (const w of this.#readyWaiters.splice(0)) w.reject(err);
    this.#holdProcess();
    // Nothing can run until a thread starts: the waiting tasks fail now rather than at their deadlines.
    if (![...this.#threads].some((t) => t.ready)) for (const job of this.#queue.splice(0)) this.#settle(job, () => job.reject(err));
    this.#restartLater();
  }

  /** Takes a thread out of the pool and terminates it; its exit and any late answer are then ignored. */
  #retire(thread: Thread<Task, Result>): void {
    this.#threads.delete(thread);
    const stopped = thread.worker.terminate();
    this.#stopping.add(stopped);
    void stopped.finally(() => this.#stopping.delete(stopped));
  }

  /** The caller of the thread's job gave it up: the thread gets a short grace (within the deadline) to end it. */
  #abandon(thread: Thread<Task, Result>): void {
    const grace = Math.min(this.#abandonedGraceMs, thread.deadlineAt - Date.now());
    this.#arm(thread, Math.max(0, grace));
  }

  /** (Re)sets the timer that stops the thread if its job has not ended `ms` from now. */
  #arm(thread: Thread<Task, Result>, ms: number): void {
    clearTimeout(thread.deadline);
    thread.deadline = setTimeout(() => this.#reclaim(thread), ms);
    thread.deadline.unref();
  }

  /**
   * The thread's job overran its deadline or its grace: fails the job (if its caller still waits), stops the thread
   * (a thread in a loop never reads another message, so terminating it is the only way back) and starts another.
   */
  #reclaim(thread: Thread<Task, Result>): void {
    if (!this.#threads.has(thread) || thread.job === undefined) return;
    this.#reclaimed++;
    const abandoned = thread.job.settled;
    this.#log.warn({ abandoned, taskTimeoutMs: this.#taskTimeoutMs }, 'token worker stuck in a task; replacing it');
    const err = new RolloutError(
      'internal',
      `token work ran longer than ${this.#taskTimeoutMs} ms (the token pool's taskTimeoutMs); the pool stopped its thread and replaced it`,
    );
    this.#finish(thread, (job) => job.reject(err));
    this.#retire(thread);
    this.#startThreads();
  }

  #restartLater(): void {
    if (this.#closed || this.#restartTimer !== undefined) return; // one retry at a time
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
      job.thread = thread;
      thread.jobId = this.#nextId++;
      if (this.#taskTimeoutMs > 0) {
        thread.deadlineAt = Date.now() + this.#taskTimeoutMs;
        this.#arm(thread, this.#taskTimeoutMs);
      }
      thread.worker.postMessage({ id: thread.jobId, task: job.task } satisfies WorkerRequest<Task>);
    }
  }

  /** Takes the thread's job off it and settles the job (unless its caller already gave up). */
  #finish(thread: Thread<Task, Result>, settle: (job: Job<Task, Result>) => void): void {
    const job = thread.job!;
    thread.job = undefined;
    job.thread = undefined;
    clearTimeout(thread.deadline);
    thread.deadline = undefined;
    thread.deadlineAt = Infinity;
    this.#settle(job, () => settle(job));
  }

  /** Settles the job's promise once (later answers for a job its caller gave up are dropped). */
  #settle(job: Job<Task, Result>, settle: () => void): void {
    if (job.settled) return;
    job.settled = true;
    this.#pending--;
    this.#holdProcess();
    if (job.onAbort) job.signal?.removeEventListener('abort', job.onAbort);
    job.onAbort = undefined;
    settle();
  }
}

/** A timer option: a whole number of ms, from 0 to the longest setTimeout can wait. */
function timerOption(name: string, ms: number): number {
  if (!Number.isInteger(ms) || ms < 0 || ms > MAX_TIMER_MS) throw RolloutError.invalid(name, `must be a whole number of ms from 0 to ${MAX_TIMER_MS}, got ${ms}`);
  return ms;
}
