import { RolloutError } from '../errors.js';
import type { EngineClient } from './types.js';

/**
 * Why a request left its backend without an answer of its own: the backend was removed or marked unhealthy.
 * Internal to the pool: it never reaches a caller, it makes the lease fail over and try again elsewhere.
 */
export class BackendGone extends Error {
  constructor(readonly backendId: string, readonly why: 'removed' | 'unhealthy') {
    super(`backend ${backendId} ${why}`);
    this.name = 'BackendGone';
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
  /** Controllers of the requests now running here, aborted with BackendGone on a forced removal. */
  readonly requests = new Set<AbortController>();
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

  /** May keep serving the trajectories it already has (draining backends finish their work). */
  get usable(): boolean {
    return this.healthy && !this.removed;
  }
}
