import { RolloutError } from '../errors.js';
import { PauseGate } from './pause-gate.js';
import type { EngineClient } from './types.js';

/**
 * Why a request left its backend without an answer of its own: the backend was removed or marked unhealthy, or
 * the connection to it failed (`unreachable`, the transport error as cause). Internal to the pool: it never
 * reaches a caller, it makes the lease try again — elsewhere when the backend is no longer usable — a bounded
 * number of times.
 */
export class BackendGone extends Error {
  constructor(readonly backendId: string, readonly why: 'removed' | 'unhealthy' | 'unreachable', options: { cause?: unknown } = {}) {
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
  resolve: () => void;
  reject: (err: unknown) => void;
  done: boolean;
}

/**
 * A per-backend concurrency gate: at most `limit` requests run at once, the rest wait in FIFO order.
 * A finishing request hands its slot straight to the oldest waiter, so later arrivals cannot barge ahead.
 */
export class SlotQueue {
  #running = 0;
  #waiting = 0;
  readonly #queue: SlotWaiter[] = [];

  constructor(readonly limit: number) {}

  get running(): number {
    return this.#running;
  }

  get waiting(): number {
    return this.#waiting;
  }

  /** Resolves once a slot is held; rejects with the signal's reason (as a RolloutError) if aborted first. */
  acquire(signal: AbortSignal): Promise<void> {
    if (signal.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    if (this.#running < this.limit && this.#waiting === 0) {
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
      this.#queue.push(waiter);
      this.#waiting++;
    });
  }

  /** Frees a held slot, handing it to the oldest live waiter if there is one. */
  release(): void {
    for (let next = this.#queue.shift(); next !== undefined; next = this.#queue.shift()) {
      if (next.done) continue;
      next.done = true;
      this.#waiting--;
      next.resolve();
      return;
    }
    this.#running--;
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
}

/**
 * The pool's mutable record of one engine. Load counters are heap keys: change them only through the pool's
 * `LoadHeap.update`. `inflightRequests` counts requests routed here and not yet finished (running or queued);
 * `capacity` (the max concurrency) is fixed for the backend's life, which keeps the weighted key honest.
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
  /** The engine's context length (prompt + generated tokens), undefined until learned (see BackendPool.learn). */
  maxModelLen: number | undefined;
  /** A GET /v1/models under way, so concurrent attempts to learn the limit share one request. */
  learning: Promise<void> | undefined;
  readonly slots: SlotQueue;
  /** Requests now running here; aborted with BackendGone on a forced removal or when the backend turns unhealthy. */
  readonly requests = new Set<InflightRequest>();
  /** Closed while generation is paused (PauseGeneration): new requests wait there, they do not fail. */
  readonly gate = new PauseGate();
  /** The engine's own pause was called (not only the pool's gate closed), so resuming must call its resume. */
  enginePaused = false;
  /** A health check after a transport failure, shared by the requests that failed together. */
  suspecting: Promise<void> | undefined;
  /** Resolvers waiting for the last trajectory to leave (drain). */
  readonly drainWaiters: Array<() => void> = [];

  constructor(
    readonly id: string,
    readonly client: EngineClient,
    readonly maxConcurrency: number,
    readonly model: string,
    public policyVersion: number,
  ) {
    this.slots = new SlotQueue(maxConcurrency);
  }

  /** What the routing key weighs load against: the requests this backend runs at once. */
  get capacity(): number {
    return this.maxConcurrency;
  }

  /** May take new trajectories. */
  get eligible(): boolean {
    return this.healthy && !this.draining && !this.removed;
  }

  /** Generation is paused: new requests are held in {@link gate}. */
  get paused(): boolean {
    return this.gate.closed;
  }

  /** May keep serving the trajectories it already has (draining backends finish their work). */
  get usable(): boolean {
    return this.healthy && !this.removed;
  }
}
