import { RolloutError } from '../errors.js';
import { PauseGate } from './pause-gate.js';
import type { EngineClient, EngineServerInfo, LogprobsMode } from './types.js';

/** Why an engine that answers is refused for serving (see BackendState.refusal). */
export type RefusalWhy = 'not serving its model' | 'returning logits';

/** Why a backend back after it was down takes no trajectory (BackendState.weightsUnknown). */
export const HELD = 'held until a ResumeGeneration confirms its weights';

/** Where a backend's capacity came from (the contract's CapacitySource). */
export type CapacitySource = 'configured' | 'engine' | 'default';

/**
 * Why a request left its backend without an answer of its own: the backend was removed or marked unhealthy, or
 * the connection to it failed (`unreachable`, the transport error as cause), or its engine was found hung (`stalled`, see
 * StallWatchdog), or its engine turned out to serve another
 * model (`not serving its model`, see BackendState.modelRefusal). Internal to the pool: it never
 * reaches a caller, it makes the lease try again — elsewhere when the backend is no longer usable — a bounded
 * number of times.
 */
export class BackendGone extends Error {
  constructor(readonly backendId: string, readonly why: 'removed' | 'unhealthy' | 'stalled' | typeof HELD | 'unreachable' | 'misdelivered' | RefusalWhy, options: { cause?: unknown } = {}) {
    super(`backend ${backendId} ${why}`, options);
    this.name = 'BackendGone';
  }
}

/** One request the backend's engine is working on (it passed the pause gate and holds a slot). */
export class InflightRequest {
  readonly controller = new AbortController();
  /** Settles when the request has left the backend (answered, failed or aborted). */
  readonly ended: Promise<void>;
  #end!: () => void;

  constructor(
    /** The backend's policy version when the request was sent. */
    readonly policyVersionStart: number,
  ) {
    this.ended = new Promise<void>((resolve) => (this.#end = resolve));
  }

  end(): void {
    this.#end();
  }
}

interface SlotWaiter {
  /** Higher goes first (see SlotQueue). */
  readonly priority: number;
  /** Arrival order, the tie-breaker among equal priorities. */
  readonly seq: number;
  resolve: () => void;
  reject: (err: unknown) => void;
  done: boolean;
}

/** Waiters in service order: higher priority first, then earlier arrival. */
function servedBefore(a: SlotWaiter, b: SlotWaiter): boolean {
  return a.priority > b.priority || (a.priority === b.priority && a.seq < b.seq);
}

/**
 * A per-backend concurrency gate: at most `limit` requests run at once, the rest wait. Waiters are served by
 * priority, highest first, and in arrival order among equal priorities (all FIFO when every priority is the same).
 * A finishing request hands its slot straight to the next waiter, so later arrivals of no higher priority cannot
 * barge ahead.
 *
 * Why priorities: the pool gives a request the number of turns its trajectory has already run (see
 * BackendPoolOptions.queueOrder). Agentic turn counts are long-tailed, so a trajectory deep into its turns is likely
 * one of the long ones that end an RL step last; serving its turns before first turns shortens the step's tail
 * (bench/routing: p90 301 → 233 s). FIFO among equals keeps it fair within a turn, and no request waits forever: the
 * trajectories ahead of it are finite and run to completion.
 *
 * The limit can change (an engine reports its capacity after it was added): a larger one admits waiters at once, a
 * smaller one lets running requests finish and admits no more until fewer than `limit` run.
 */
export class SlotQueue {
  #limit: number;
  #running = 0;
  #waiting = 0;
  #seq = 0;
  /** Sorted by {@link servedBefore}; aborted waiters stay (done) until they reach the front. */
  readonly #queue: SlotWaiter[] = [];

  constructor(limit: number) {
    this.#limit = limit;
  }

  get limit(): number {
    return this.#limit;
  }

  get running(): number {
    return this.#running;
  }

  get waiting(): number {
    return this.#waiting;
  }

  /**
   * Resolves once a slot is held; rejects with the signal's reason (as a RolloutError) if aborted first.
   * `priority` (default 0) orders the wait: higher first, ties in arrival order.
   */
  acquire(signal: AbortSignal, priority = 0): Promise<void> {
    if (signal.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    if (this.#running < this.#limit && this.#waiting === 0) {
      this.#running++;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const onAbort = (): void => {
        if (waiter.done) return;
        waiter.done = true;
        this.#waiting--;
        reject(RolloutError.from(signal.reason, 'cancelled'));
      };
      const waiter: SlotWaiter = {
        priority,
        seq: this.#seq++,
        done: false,
        resolve: () => {
          signal.removeEventListener('abort', onAbort);
          resolve();
        },
        reject: (err) => {
          signal.removeEventListener('abort', onAbort);
          reject(err);
        },
      };
      signal.addEventListener('abort', onAbort, { once: true });
      this.#enqueue(waiter);
      this.#waiting++;
    });
  }

  /** Frees a held slot, handing it to the next live waiter if there is one (and the limit allows). */
  release(): void {
    this.#running--;
    this.#grant();
  }

  /** Changes the limit (see the class); waiters get the slots a larger limit opens. */
  resize(limit: number): void {
    this.#limit = limit;
    this.#grant();
  }

  /** Rejects every waiter (the backend went away); running requests are the caller's business. */
  rejectAll(err: unknown): void {
    for (const waiter of this.#queue.splice(0)) {
      if (waiter.done) continue;
      waiter.done = true;
      this.#waiting--;
      waiter.reject(err);
    }
  }

  /** Inserts after every waiter served before it (binary search: the queue is sorted). */
  #enqueue(waiter: SlotWaiter): void {
    let lo = 0;
    let hi = this.#queue.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (servedBefore(this.#queue[mid]!, waiter)) lo = mid + 1;
      else hi = mid;
    }
    this.#queue.splice(lo, 0, waiter);
  }

  #grant(): void {
    while (this.#running < this.#limit) {
      const next = this.#queue.shift();
      if (next === undefined) return;
      if (next.done) continue;
      next.done = true;
      this.#waiting--;
      this.#running++;
      next.resolve();
    }
  }
}

/**
 * The pool's mutable record of one engine. Load counters are heap keys: change them only through the pool's
 * `LoadHeap.update`. `inflightRequests` counts requests routed here and not yet finished (running or queued);
 * `capacity` (the max concurrency) is a heap key too: it changes at most once, when an engine whose capacity was
 * not configured reports its own (BackendPool.learn), and only through `LoadHeap.update`.
 */
export class BackendState {
  healthy = true;
  draining = false;
  removed = false;
  inflightTrajectories = 0;
  inflightRequests = 0;
  assignedTotal = 0;
  /** Trajectories that had to leave this backend (removed or unhealthy under them). */
  failoversOut = 0;
  /** Answers refused as meant for another request (EngineMisdeliveredError): a proxy or connection mixing answers up. */
  misdeliveredAnswers = 0;
  /**
   * When (performance.now() ms) the engine last answered a request, and when its requests last went from none to some:
   * the later of the two is how long it has left every request unanswered (see StallWatchdog).
   */
  lastAnswerAt = 0;
  busySince = 0;
  /**
   * Found hung (StallWatchdog): none of its requests answered and its work counters stood still for the stall window,
   * though it may answer its health checks. Marked unhealthy with it — its trajectories moved, it takes none — and
   * a passing probe does not lift it (its /health answered all along): its counters moving does, or a failed probe (it
   * went down, perhaps to restart: it then recovers as any engine that was down).
   */
  stalled = false;
  /** Times it was found hung. */
  stalls = 0;
  /** The policy version it was labelled with when it was last found hung (see BackendPool's recovery of a hung engine). */
  stalledAtVersion = 0;
  /**
   * No request is sent to the engine before this time (performance.now() ms): the end of the last Retry-After it
   * answered a busy request with, bounded by the pool's maxRetryAfterMs (see PoolLease). 0: none.
   */
  retryNotBefore = 0;
  /** The engine's context length (prompt + generated tokens), undefined until learned (see BackendPool.learn). */
  maxModelLen: number | undefined;
  /** `maxModelLen` was given when the backend was added: it is never asked or forgotten. */
  maxModelLenConfigured = false;
  /**
   * What the engine said about its model (`maxModelLen`) or about how it runs (`serverInfo`) may no longer hold: it
   * came back after it was down (perhaps restarted with another --max-model-len, --max-num-seqs, --logprobs-mode), or
   * it cut an answer short of a limit it should not have reached. Asked again at the next learn; what was learned
   * stays in use until the engine answers (what was configured is never asked).
   */
  modelInfoStale = false;
  serverInfoStale = false;
  /**
   * The engine answered that it does not serve the backend's model (GET /v1/models lists no such card): every request
   * would be refused, so the backend takes no trajectory and keeps none (not eligible, not usable) until a later
   * answer lists the model. AddBackend and the start-up refuse such an engine (BackendPool.checkEngineAgrees).
   */
  modelRefusal: RolloutError | undefined;
  /**
   * The engine reports a logprobs mode that returns logits, not log-probabilities (vLLM --logprobs-mode *_logits):
   * its answers would be recorded as logprobs, so it is refused like an engine serving another model, until a later
   * answer reports a usable mode.
   */
  modeRefusal: RolloutError | undefined;
  /** A GET /v1/models under way, so concurrent attempts to learn the limit share one request. */
  learning: Promise<void> | undefined;
  /** Where `maxConcurrency` came from. */
  capacitySource: CapacitySource = 'configured';
  /** The logprobs mode AddBackend or the config declared, if any. */
  declaredLogprobsMode: LogprobsMode | undefined;
  /** What the engine said about how it runs, once it answered (see BackendPool.learn). */
  serverInfo: EngineServerInfo | undefined;
  /** Set once the log has been told that this engine's logprobs do not match what requests sample (warned once). */
  logprobsWarned = false;
  readonly slots: SlotQueue;
  /** Requests now running here; aborted with BackendGone on a forced removal or when the backend turns unhealthy. */
  readonly requests = new Set<InflightRequest>();
  /** Closed while generation is paused (PauseGeneration): new requests wait there, they do not fail. */
  readonly gate = new PauseGate();
  /** The engine's own pause was called (not only the pool's gate closed), so resuming must call its resume. */
  enginePaused = false;
  /**
   * PauseGeneration and ResumeGeneration calls that reached this backend, counted when each starts: a pause that
   * sees a resume begin after it started has been superseded (it must not leave the engine paused behind an open
   * gate), and a resume that sees a pause begin after it started must not open that pause's gate.
   */
  pauses = 0;
  resumes = 0;
  /** A pool-wide resume found this backend down with its engine paused: resumed when it is healthy again. */
  resumePending = false;
  /**
   * Back after it was down (or hung) while serving a policy version other than 0: it may have restarted with other
   * weights, or missed a weight sync, so it is held (BackendPoolOptions.holdRecoveredBackends) until a resume reaches
   * it: its gate closed, neither eligible nor usable — new trajectories wait for another engine (bounded by the pool's
   * acquireTimeoutMs, then backend_error), and trajectories pinned here move off it as from an engine gone — so that
   * nothing waits for a ResumeGeneration the trainer may not send until its rollouts are done. Change it only through
   * the pool's `LoadHeap.update` (it is part of `eligible`).
   */
  weightsUnknown = false;
  /**
   * The engine pause or resume call of this pool in flight, if any: calls go one at a time, in the pool's order (two
   * at once over separate connections could reach the engine in either order), and a resume aborts a pause call it
   * overtakes instead of waiting for it (see pause-control.ts engineCall).
   */
  engineCall: { kind: 'pause' | 'resume'; controller: AbortController; settled: Promise<void> } | undefined;
  /** A health check after a transport failure, shared by the requests that failed together. */
  suspecting: Promise<void> | undefined;
  /** Resolvers waiting for the last trajectory to leave (drain). */
  readonly drainWaiters: Array<() => void> = [];

  constructor(
    readonly id: string,
    readonly client: EngineClient,
    public maxConcurrency: number,
    readonly model: string,
    public policyVersion: number,
  ) {
    this.slots = new SlotQueue(maxConcurrency);
  }

  /** What the routing key weighs load against: the requests this backend runs at once. */
  get capacity(): number {
    return this.maxConcurrency;
  }

  /**
   * The logprobs mode trajectories record for turns sampled here: what the engine reports when it says, else what
   * was declared, else unknown. (A declaration the engine contradicts is refused when the backend is added; if the
   * engine only says so later, its word is what the record must hold.)
   */
  get logprobsMode(): LogprobsMode | undefined {
    return this.serverInfo?.logprobsMode ?? this.declaredLogprobsMode;
  }

  /** Why the engine, though it may answer its health checks, must not serve: the first refusal in effect. */
  get refusal(): RolloutError | undefined {
    return this.modelRefusal ?? this.modeRefusal;
  }

  /** May take new trajectories. */
  get eligible(): boolean {
    return this.healthy && !this.draining && !this.removed && !this.weightsUnknown && this.refusal === undefined;
  }

  /** Generation is paused: new requests are held in {@link gate}. */
  get paused(): boolean {
    return this.gate.closed;
  }

  /** May keep serving the trajectories it already has (draining backends finish their work). */
  get usable(): boolean {
    return this.healthy && !this.removed && !this.weightsUnknown && this.refusal === undefined;
  }

  /** Why it is not {@link usable} (what a request that finds it so is told). */
  get unusableWhy(): 'removed' | 'unhealthy' | 'stalled' | typeof HELD | RefusalWhy {
    if (this.removed) return 'removed';
    if (!this.healthy) return this.stalled ? 'stalled' : 'unhealthy';
    if (this.weightsUnknown) return HELD;
    return this.modelRefusal !== undefined ? 'not serving its model' : 'returning logits';
  }
}
