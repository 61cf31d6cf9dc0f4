import { availableParallelism } from 'node:os';
import { RolloutError, type ErrorCode } from '../errors.js';
import { silentLogger, type Logger } from '../observability/logger.js';
import { timerOption } from '../timers.js';
import { DEFAULT_START_TIMEOUT_MS, ThreadPool, type PoolThread, type ThreadPoolSpec, type ThreadReply, type ThreadRequest } from '../workers/thread-pool.js';

/** What a worker script receives and answers (token-worker.ts speaks it). */
export type WorkerRequest<Task> = ThreadRequest<Task>;
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
  /**
   * Longest a thread may take to start (load its tokenizer and template) before it is terminated and the start fails
   * (`failed_precondition`, retried after a pause), ms; 0 = none. Default 60 s: a start takes ~1.5 s here.
   */
  startTimeoutMs?: number;
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
 * until its caller's own deadline. A thread that cannot even start (its init failed, it exited before it was ready,
 * or it was not ready within `startTimeoutMs`: then terminated) fails the queued tasks and is retried after a pause,
 * so a broken model folder cannot spin and a hung load cannot hold every task until its deadline. `close()`
 * refuses new tasks, fails waiting and running ones with `unavailable` and terminates every thread (the server's
 * shutdown awaits it: no thread outlives the server).
 *
 * Threads start with the first task (or `ready()`), so a server whose token work all fits inline never pays for
 * loading the tokenizer again; they are unref'ed, so a pool nobody closed does not keep the process alive. The
 * mechanism is {@link ThreadPool} (src/workers/thread-pool.ts); this class gives it the token pool's errors, log lines
 * and bounds.
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
  readonly #taskTimeoutMs: number;
  readonly #abandonedGraceMs: number;
  readonly #log: Logger;
  readonly #pool: ThreadPool<Task, Result, WorkerReply<Result>, undefined>;
  #reclaimed = 0;

  constructor(options: TokenPoolOptions) {
    this.size = options.size ?? defaultTokenWorkers();
    if (!Number.isInteger(this.size) || this.size < 1) throw RolloutError.invalid('tokenWorkers.count', `must be a positive integer, got ${this.size}`);
    this.#taskTimeoutMs = timerOption('taskTimeoutMs', options.taskTimeoutMs ?? 60_000);
    this.#abandonedGraceMs = timerOption('abandonedTaskGraceMs', options.abandonedTaskGraceMs ?? 1_000);
    this.#log = (options.logger ?? silentLogger()).child({ component: 'token-pool' });
    this.#pool = new ThreadPool<Task, Result, WorkerReply<Result>, undefined>({
      script: options.script,
      workerData: options.workerData,
      size: this.size,
      maxQueued: options.maxQueued ?? 4096,
      log: this.#log,
      threadName: 'token worker',
      errors: TOKEN_POOL_ERRORS,
      threadState: () => undefined,
      result: (reply) => reply.result,
      taskError: (reply) => new RolloutError(reply.code, reply.message, reply.field === undefined ? {} : { field: reply.field }),
      startTimeoutMs: timerOption('startTimeoutMs', options.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS),
      timerMs: this.#taskTimeoutMs,
      abandonedTaskGraceMs: this.#abandonedGraceMs,
      overtime: (thread, abandoned) => this.#reclaim(thread, abandoned),
    });
  }

  /** Starts every thread and resolves when each has loaded (e.g. its tokenizer); rejects if one could not. */
  ready(): Promise<void> {
    return this.#pool.ready();
  }

  stats(): TokenPoolStats {
    const pool = this.#pool;
    return { ...pool.counts(), completed: pool.completed, crashes: pool.crashes, reclaimed: this.#reclaimed };
  }

  /**
   * Runs a task on a thread. An abort of `signal` while the task waits removes it; while it runs, the caller gets
   * the abort at once, the thread's answer is dropped, and a thread still on it after `abandonedTaskGraceMs` is
   * replaced.
   */
  run(task: Task, signal?: AbortSignal): Promise<Result> {
    return this.#pool.run(task, signal);
  }

  /** Fails waiting and running tasks with `unavailable` and terminates every thread. */
  close(): Promise<void> {
    return this.#pool.close();
  }

  /**
   * The thread's task overran `taskTimeoutMs` or, given up, its grace: fails it (if its caller still waits), stops the
   * thread (a thread in a loop never reads another message, so terminating it is the only way back) and starts another.
   */
  #reclaim(thread: PoolThread<undefined>, abandoned: boolean): void {
    this.#reclaimed++;
    this.#log.warn({ abandoned, taskTimeoutMs: this.#taskTimeoutMs }, 'token worker stuck in a task; replacing it');
    const error = new RolloutError(
      'internal',
      `token work ran longer than ${this.#taskTimeoutMs} ms (the token pool's taskTimeoutMs); the pool stopped its thread and replaced it`,
    );
    this.#pool.replace(thread, { error });
  }
}

/** The token pool's errors: a pool that cannot serve is `unavailable`, a thread that cannot load `failed_precondition`. */
const TOKEN_POOL_ERRORS: ThreadPoolSpec<unknown, ThreadReply, undefined>['errors'] = {
  closed: () => new RolloutError('unavailable', 'token workers are shut down'),
  shuttingDown: () => new RolloutError('unavailable', 'token workers are shutting down'),
  queueFull: (max) => new RolloutError('resource_exhausted', `token work queue is full (${max} tasks waiting)`),
  couldNotStart: (cause) =>
    new RolloutError(
      'failed_precondition',
      'message' in cause
        ? `token worker could not start: ${cause.message}`
        : 'code' in cause
          ? `token worker could not start: it exited with code ${cause.code} while loading`
          : `token worker could not start: it did not become ready within ${cause.timeoutMs} ms (the token pool's startTimeoutMs; a hung model load or file system?); the pool terminated it`,
    ),
  exited: (code) => new RolloutError('internal', `token worker exited with code ${code} while working on this sample; the pool replaced it`),
  unsendable: (err) => new RolloutError('internal', `token work could not be sent to its thread: ${err instanceof Error ? err.message : String(err)}`, { cause: err }),
};

