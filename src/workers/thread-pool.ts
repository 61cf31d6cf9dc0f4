import { Worker } from 'node:worker_threads';
import { RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';

/** What a pool sends a thread: one task, with the id its answer must carry. */
export type ThreadRequest<Task> = { id: number; task: Task };

/**
 * The replies a {@link ThreadPool} understands; a pool's own protocol may add fields (e.g. the CPU time a checker
 * thread has used) and must answer `result` or `error` for every request, with its id.
 */
export type ThreadReply =
  | { type: 'ready' }
  | { type: 'init-error'; message: string }
  | { type: 'result'; id: number }
  | { type: 'error'; id: number };

/** A thread as a pool's bound ({@link ThreadPoolSpec.overtime}) sees it. */
export interface PoolThread<State> {
  readonly worker: Worker;
  /** When its current task was sent, ms since the epoch (set when the pool has a timer: `timerMs` > 0). */
  readonly startedAt: number;
  /** The pool's own per-thread state ({@link ThreadPoolSpec.threadState}). */
  readonly state: State;
}

/** How a task ends when the pool settles it itself (a bound it passed): a result or an error. */
export type ForcedOutcome<Result> = { result: Result } | { error: RolloutError };

/**
 * What makes one pool differ from another: its thread's script, its errors and log lines, the bound of a task and how
 * a reply becomes a result. The mechanism (queue, threads' lifecycle, ref/unref, replacing a thread) is
 * {@link ThreadPool}'s.
 */
export interface ThreadPoolSpec<Result, Reply extends ThreadReply, State> {
  script: URL;
  workerData?: unknown;
  size: number;
  /** Tasks waiting for a thread beyond which `run` refuses more ({@link errors}.queueFull). */
  maxQueued: number;
  /** The component's child logger. */
  log: Logger;
  /** What a thread is called in log lines ("token worker"). */
  threadName: string;
  errors: {
    /** `run`/`ready` after close. */
    closed(): RolloutError;
    /** Tasks waiting or running when close() is called. */
    shuttingDown(): RolloutError;
    queueFull(maxQueued: number): RolloutError;
    /**
     * A thread answered init-error (`message`), exited before it was ready (`code`), or was not ready within
     * {@link ThreadPoolSpec.startTimeoutMs} (`timeoutMs`: it was terminated).
     */
    couldNotStart(cause: { message: string } | { code: number } | { timeoutMs: number }): RolloutError;
    /** A ready thread exited (crash, out of memory, process.exit) with a task on it. */
    exited(code: number): RolloutError;
    /** A task the thread could not be sent (postMessage threw: a value structured clone refuses). */
    unsendable(err: unknown): RolloutError;
  };
  /** A thread's own state, made when it is started. */
  threadState(): State;
  /** Sees every reply of a thread in the pool before the pool acts on it (e.g. the CPU time it reports). */
  observe?(thread: PoolThread<State>, reply: Reply): void;
  /** A `result` reply's value. */
  result(reply: Extract<Reply, { type: 'result' }>): Result;
  /** An `error` reply's error. */
  taskError(reply: Extract<Reply, { type: 'error' }>): RolloutError;
  /**
   * How long a thread may take from its start to its `ready`, ms (0: no bound; default
   * {@link DEFAULT_START_TIMEOUT_MS}). A thread not ready by then (its module import hangs, a top-level await never
   * settles, a read of a hung file system) is terminated and treated as a failed start ({@link errors}.couldNotStart
   * with `timeoutMs`): without the bound every task and ready() waited on it until their callers' own deadlines.
   */
  startTimeoutMs?: number;
  /** Wall time after a task is sent at which {@link overtime} is called, ms (0: never). */
  timerMs: number;
  /**
   * How long a thread may go on with a task its caller gave up before {@link overtime} is called, ms (bounded by
   * `timerMs`); undefined: the task goes on under its bound.
   */
  abandonedTaskGraceMs?: number;
  /**
   * The thread's timer fired with a task on it (its caller may have given it up: `abandoned`). The pool's bound:
   * {@link ThreadPool.replace} the thread, or {@link ThreadPool.arm} the timer again.
   */
  overtime(thread: PoolThread<State>, abandoned: boolean): void;
}

/**
 * Default {@link ThreadPoolSpec.startTimeoutMs}: a minute. Measured on a 2-core box with load ~1.5, two token threads
 * start (tsx loader, then the packaged Qwen3 tokenizer and template) in ~1.5 s, two answer checker threads (and a
 * first check) in ~0.3 s; a minute leaves a wide margin for a loaded machine and a large vocabulary, and still names
 * a stuck start long before a stage deadline would time out every trajectory with no cause.
 */
export const DEFAULT_START_TIMEOUT_MS = 60_000;

interface Job<Task, Result, State> {
  task: Task;
  resolve: (result: Result) => void;
  reject: (err: RolloutError) => void;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
  /** The thread running it; undefined while it waits. */
  thread: Thread<Task, Result, State> | undefined;
  /** Its promise is settled (a caller that gave up is not answered again). */
  settled: boolean;
}

interface Thread<Task, Result, State> extends PoolThread<State> {
  ready: boolean;
  job: Job<Task, Result, State> | undefined;
  jobId: number;
  startedAt: number;
  /** Calls the spec's overtime when the job overruns its bound (or, once given up, its grace). */
  timer: NodeJS.Timeout | undefined;
  /** Fails the start of a thread not ready within the spec's startTimeoutMs; cleared on ready, exit, retire and close. */
  startTimer: NodeJS.Timeout | undefined;
}

/**
 * A fixed-size pool of worker threads, each running one task at a time from a bounded FIFO queue — the mechanism the
 * token pool (src/tokens/token-pool.ts) and the answer checkers' pool (src/environments/math/check-pool.ts) share;
 * each supplies a {@link ThreadPoolSpec} (errors, log lines, the bound of a task, what a reply means).
 *
 * Invariants:
 * - A task's promise settles exactly once: with the thread's answer, the pool's bound ({@link replace}), its caller's
 *   abort, the death of its thread, a failed start, a task structured clone refuses ({@link ThreadPoolSpec}'s
 *   `unsendable`), or close(); an answer after that is dropped.
 * - A waiting task exists only while every ready thread is busy (each event that frees or readies a thread dispatches).
 * - Threads are ref'ed while a task or a ready() waits and unref'ed otherwise: a script awaiting one does not end
 *   before it, and an idle pool nobody closed does not keep its process. Listeners are added before the unref (in
 *   Node 20 adding a 'message' listener refs the port again).
 * - A thread that dies while ready fails only its task and is replaced at once; one that cannot start (init-error,
 *   exit before ready, or not ready within `startTimeoutMs`: then terminated) fails what waits when no thread is
 *   ready, and is retried after a doubling pause (0.5–30 s), so a broken script cannot spin and a hung one cannot
 *   hold every task until its caller's deadline.
 * - close() refuses new tasks, fails waiting and running ones, and resolves when every thread (also those being
 *   replaced) has ended.
 *
 * The hot path (run → postMessage → reply → resolve) allocates the job and its promise, the request and (with a
 * signal) the abort listener, nothing else, and awaits nothing.
 *
 * @example
 * const pool = new ThreadPool<Task, Result, WorkerReply<Result>, undefined>({
 *   script, size: 2, maxQueued: 4096, log, threadName: 'token worker', errors, threadState: () => undefined,
 *   result: (reply) => reply.result, taskError: (reply) => new RolloutError(reply.code, reply.message),
 *   timerMs: 60_000, overtime: (thread) => pool.replace(thread, { error: new RolloutError('internal', 'too long') }),
 * });
 */
export class ThreadPool<Task, Result, Reply extends ThreadReply, State> {
  readonly #spec: ThreadPoolSpec<Result, Reply, State>;
  readonly #threads = new Set<Thread<Task, Result, State>>();
  /** Threads being terminated after a failed start or a bound: close() waits for them too. */
  readonly #stopping = new Set<Promise<number>>();
  readonly #queue: Job<Task, Result, State>[] = [];
  #nextId = 0;
  #closed = false;
  #restartDelayMs = 0;
  #restartTimer: NodeJS.Timeout | undefined;
  #readyWaiters: { resolve: () => void; reject: (err: RolloutError) => void }[] = [];
  /** Tasks asked for and not settled yet: while there are any (or ready() waiters) the threads are ref'ed. */
  #pending = 0;
  #held = false;
  #accepted = 0;
  #completed = 0;
  #crashes = 0;

  constructor(spec: ThreadPoolSpec<Result, Reply, State>) {
    this.#spec = spec;
  }

  /** Tasks taken (not refused at `run`). */
  get accepted(): number {
    return this.#accepted;
  }

  /** Tasks their thread answered (a result or an error). */
  get completed(): number {
    return this.#completed;
  }

  /** Threads that died while the pool was open (each replaced, or retried after a pause when it died loading). */
  get crashes(): number {
    return this.#crashes;
  }

  /** Threads alive (starting or ready), busy ones, and tasks waiting. */
  counts(): { workers: number; busy: number; queued: number } {
    let busy = 0;
    for (const t of this.#threads) if (t.job) busy++;
    return { workers: this.#threads.size, busy, queued: this.#queue.length };
  }

  /** The threads' ids (worker threadId). */
  threadIds(): number[] {
    return [...this.#threads].map((t) => t.worker.threadId);
  }

  /** Starts every thread and resolves when each is ready; rejects if one could not start. */
  ready(): Promise<void> {
    if (this.#closed) return Promise.reject(this.#spec.errors.closed());
    this.#startThreads();
    if (this.#threads.size === this.#spec.size && [...this.#threads].every((t) => t.ready)) return Promise.resolve();
    return new Promise((resolve, reject) => {
      this.#readyWaiters.push({ resolve, reject });
      this.#holdProcess();
    });
  }

  /**
   * Runs a task on a thread. An abort of `signal` while the task waits removes it; while it runs, the caller gets the
   * abort at once, the thread's answer is dropped, and (with `abandonedTaskGraceMs`) a thread still on it after the
   * grace is handed to the spec's overtime.
   */
  run(task: Task, signal?: AbortSignal): Promise<Result> {
    if (this.#closed) return Promise.reject(this.#spec.errors.closed());
    if (signal?.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    if (this.#queue.length >= this.#spec.maxQueued) return Promise.reject(this.#spec.errors.queueFull(this.#spec.maxQueued));
    this.#accepted++;
    return new Promise<Result>((resolve, reject) => {
      const job: Job<Task, Result, State> = { task, resolve, reject, signal, onAbort: undefined, thread: undefined, settled: false };
      this.#pending++;
      this.#holdProcess();
      if (signal) {
        job.onAbort = () => {
          const at = this.#queue.indexOf(job);
          if (at >= 0) this.#queue.splice(at, 1);
          if (this.#settle(job)) reject(RolloutError.from(signal.reason, 'cancelled'));
          if (job.thread && this.#spec.abandonedTaskGraceMs !== undefined) this.#abandon(job.thread, this.#spec.abandonedTaskGraceMs);
        };
        signal.addEventListener('abort', job.onAbort, { once: true });
      }
      this.#queue.push(job);
      this.#startThreads();
      this.#dispatch();
    });
  }

  /** Fails waiting and running tasks with the spec's shuttingDown error and terminates every thread. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#restartTimer);
    const stopping = this.#spec.errors.shuttingDown();
    for (const job of this.#queue.splice(0)) if (this.#settle(job)) job.reject(stopping);
    const threads = [...this.#threads];
    this.#threads.clear();
    for (const t of threads) {
      clearTimeout(t.startTimer);
      if (t.job) this.#finish(t, { error: stopping });
    }
    for (const w of this.#readyWaiters.splice(0)) w.reject(stopping);
    this.#holdProcess();
    await Promise.all([...threads.map((t) => t.worker.terminate()), ...this.#stopping]);
  }

  /** (Re)sets the timer that calls the spec's overtime if the thread's task has not ended `ms` from now. */
  arm(thread: PoolThread<State>, ms: number): void {
    const t = thread as Thread<Task, Result, State>;
    clearTimeout(t.timer);
    t.timer = setTimeout(() => this.#onTimer(t), ms);
    t.timer.unref();
  }

  /**
   * Ends the thread's task with `outcome` (unless its caller gave it up), terminates the thread — one stuck in a loop
   * reads no message, so this is the only way back — and starts another.
   */
  replace(thread: PoolThread<State>, outcome: ForcedOutcome<Result>): void {
    const t = thread as Thread<Task, Result, State>;
    if (t.job) this.#finish(t, outcome);
    this.#retire(t);
    this.#startThreads();
    this.#dispatch();
  }

  #startThreads(): void {
    if (this.#closed || this.#restartTimer !== undefined) return; // after a failed start, the timer starts the next one
    while (this.#threads.size < this.#spec.size) this.#spawn();
  }

  #spawn(): void {
    const spec = this.#spec;
    const worker = new Worker(spec.script, { workerData: spec.workerData });
    const thread: Thread<Task, Result, State> = {
      worker,
      ready: false,
      job: undefined,
      jobId: -1,
      startedAt: 0,
      timer: undefined,
      startTimer: undefined,
      state: spec.threadState(),
    };
    this.#threads.add(thread);
    const startTimeoutMs = spec.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS;
    if (startTimeoutMs > 0) {
      // Unref'ed: while a task or ready() waits the thread itself keeps the process (ref'ed), so the timer fires.
      thread.startTimer = setTimeout(() => this.#onStartTimeout(thread, startTimeoutMs), startTimeoutMs);
      thread.startTimer.unref();
    }
    worker.on('message', (reply: Reply) => this.#onReply(thread, reply));
    // An uncaught exception in the thread: 'exit' follows, where the thread is replaced.
    worker.on('error', (err) => spec.log.error({ err }, `${spec.threadName} failed`));
    worker.on('exit', (code) => this.#onExit(thread, code));
    // After the listeners: adding a 'message' listener refs the worker's port again (Node 20), which undid an unref
    // made before it (a pool nobody closed kept its process alive: `serve --math-checker` did not exit on SIGTERM).
    if (!this.#held) worker.unref();
  }

  /**
   * Threads keep the process alive while a task or a ready() waits, and only then: a script awaiting one must not end
   * before it (Node ends a process whose only work is an unref'ed thread's, exit code 13 for a pending top-level
   * await), and an idle pool nobody closed must not keep its process.
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

  #onReply(thread: Thread<Task, Result, State>, reply: Reply): void {
    // A thread the pool let go (replaced, or failed to start) may still have answered on its way out: not to be used.
    if (!this.#threads.has(thread)) return;
    this.#spec.observe?.(thread, reply);
    switch (reply.type) {
      case 'ready':
        clearTimeout(thread.startTimer);
        thread.startTimer = undefined;
        thread.ready = true;
        this.#restartDelayMs = 0;
        if ([...this.#threads].every((t) => t.ready)) for (const w of this.#readyWaiters.splice(0)) w.resolve();
        this.#holdProcess();
        this.#dispatch();
        return;
      case 'init-error':
        this.#retire(thread);
        this.#startFailed(this.#spec.errors.couldNotStart({ message: reply.message }), undefined);
        return;
      case 'result':
      case 'error': {
        const job = thread.job;
        if (job === undefined || reply.id !== thread.jobId) return;
        this.#completed++;
        this.#take(thread);
        if (this.#settle(job)) {
          if (reply.type === 'result') job.resolve(this.#spec.result(reply as Extract<Reply, { type: 'result' }>));
          else job.reject(this.#spec.taskError(reply as Extract<Reply, { type: 'error' }>));
        }
        this.#dispatch();
      }
    }
  }

  #onExit(thread: Thread<Task, Result, State>, code: number): void {
    if (!this.#threads.delete(thread)) return; // closed, or already let go (init error, start timeout, bound)
    clearTimeout(thread.startTimer);
    this.#crashes++;
    if (!thread.ready) {
      // Died while loading (e.g. out of memory on the model folder): a replacement would most likely die the same
      // way, so this is a failed start, with its back-off, not a crash to replace at once (that spun in a loop).
      this.#startFailed(this.#spec.errors.couldNotStart({ code }), code);
      return;
    }
    this.#spec.log.error({ code, busy: thread.job !== undefined }, `${this.#spec.threadName} exited; replacing it`);
    if (thread.job) this.#finish(thread, { error: this.#spec.errors.exited(code) });
    this.#spawn();
  }

  /** A thread could not start (already out of the pool): fails who waits on it and retries after a pause. */
  #startFailed(err: RolloutError, code: number | undefined): void {
    this.#spec.log.error({ err, code }, `${this.#spec.threadName} could not start`);
    for (const w of this.#readyWaiters.splice(0)) w.reject(err);
    this.#holdProcess();
    // Nothing can run until a thread starts: the waiting tasks fail now rather than at their deadlines.
    if (![...this.#threads].some((t) => t.ready)) for (const job of this.#queue.splice(0)) if (this.#settle(job)) job.reject(err);
    this.#restartLater();
  }

  /**
   * A thread was not ready within `ms` of its start: terminated (by its reference) like any thread let go — a `ready`
   * it posts after this is ignored ({@link #onReply} uses only threads of the pool) — and a failed start, retried
   * after the pause.
   */
  #onStartTimeout(thread: Thread<Task, Result, State>, ms: number): void {
    thread.startTimer = undefined;
    if (!this.#threads.has(thread) || thread.ready) return;
    this.#retire(thread);
    this.#startFailed(this.#spec.errors.couldNotStart({ timeoutMs: ms }), undefined);
  }

  /** Takes a thread out of the pool and terminates it; its exit and any late answer are then ignored. */
  #retire(thread: Thread<Task, Result, State>): void {
    this.#threads.delete(thread);
    clearTimeout(thread.startTimer);
    thread.startTimer = undefined;
    const stopped = thread.worker.terminate();
    this.#stopping.add(stopped);
    void stopped.finally(() => this.#stopping.delete(stopped));
  }

  /** The caller of the thread's job gave it up: the thread gets a short grace (within its timer) to end it. */
  #abandon(thread: Thread<Task, Result, State>, graceMs: number): void {
    const left = this.#spec.timerMs > 0 ? thread.startedAt + this.#spec.timerMs - Date.now() : Infinity;
    this.arm(thread, Math.max(0, Math.min(graceMs, left)));
  }

  #onTimer(thread: Thread<Task, Result, State>): void {
    if (!this.#threads.has(thread) || thread.job === undefined) return;
    this.#spec.overtime(thread, thread.job.settled);
  }

  #restartLater(): void {
    if (this.#closed || this.#restartTimer !== undefined) return; // one retry at a time
    this.#restartDelayMs = Math.min(30_000, Math.max(500, this.#restartDelayMs * 2));
    this.#restartTimer = setTimeout(() => {
      this.#restartTimer = undefined;
      if (!this.#closed && this.#threads.size < this.#spec.size) this.#spawn();
    }, this.#restartDelayMs);
    this.#restartTimer.unref();
  }

  #dispatch(): void {
    for (const thread of this.#threads) {
      if (this.#queue.length === 0) return;
      if (!thread.ready || thread.job) continue;
      // A task that could not be sent leaves its thread free: the next waiting one goes to it.
      while (!this.#send(thread) && this.#queue.length > 0);
    }
  }

  /** Sends the first waiting task to the (ready, free) thread; false when it could not be sent (it failed). */
  #send(thread: Thread<Task, Result, State>): boolean {
    const job = this.#queue.shift()!;
    thread.job = job;
    job.thread = thread;
    thread.jobId = this.#nextId++;
    if (this.#spec.timerMs > 0) {
      thread.startedAt = Date.now();
      this.arm(thread, this.#spec.timerMs);
    }
    try {
      thread.worker.postMessage({ id: thread.jobId, task: job.task } satisfies ThreadRequest<Task>);
      return true;
    } catch (err) {
      // Structured clone refused the task (a function, a class instance with private state...): nothing was sent.
      // Thrown from here it escaped a thread's 'message' listener (an uncaught exception) and left the task on the
      // thread for good.
      this.#finish(thread, { error: this.#spec.errors.unsendable(err) });
      return false;
    }
  }

  /** Takes the thread's job off it (the job is still to be settled). */
  #take(thread: Thread<Task, Result, State>): void {
    thread.job!.thread = undefined;
    thread.job = undefined;
    clearTimeout(thread.timer);
    thread.timer = undefined;
  }

  /** Takes the thread's job off it and settles it with `outcome` (unless its caller already gave up). */
  #finish(thread: Thread<Task, Result, State>, outcome: ForcedOutcome<Result>): void {
    const job = thread.job!;
    this.#take(thread);
    if (!this.#settle(job)) return;
    if ('error' in outcome) job.reject(outcome.error);
    else job.resolve(outcome.result);
  }

  /** Marks the job settled, once: true when the caller is to settle its promise now (false: it already was). */
  #settle(job: Job<Task, Result, State>): boolean {
    if (job.settled) return false;
    job.settled = true;
    this.#pending--;
    this.#holdProcess();
    if (job.onAbort) job.signal?.removeEventListener('abort', job.onAbort);
    job.onAbort = undefined;
    return true;
  }
}
