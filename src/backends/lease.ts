import { randomUUID } from 'node:crypto';
import { RolloutError, throwIfAborted } from '../errors.js';
import { BackendGone, type BackendState } from './backend-state.js';
import type { GenerateRequest, GenerateResult, LogprobsMode } from './types.js';

/** A completion plus where it came from, for the trajectory's turn record (backend, policy_version, logprobs mode). */
export interface LeaseResult extends GenerateResult {
  backendId: string;
  policyVersion: number;
  /** Which logprobs the backend reports (BackendState.logprobsMode); undefined when unknown. */
  logprobsMode: LogprobsMode | undefined;
}

/**
 * One trajectory's hold on a backend, from its first LLM call to its end. Every `generate` goes to the same
 * engine so the conversation prefix stays in that engine's KV cache; the lease moves (fails over) only when
 * its backend is removed or marked unhealthy. `release` must be called exactly when the trajectory ends
 * (the pipeline's finalize); calling it again is a no-op.
 *
 * @example
 * const lease = await pool.acquire(`${taskId}/${sampleIndex}`, { signal });
 * try {
 *   const turn = await lease.generate({ promptIds, maxTokens: 512, signal });
 * } finally {
 *   lease.release();
 * }
 */
export interface BackendLease {
  readonly trajectoryKey: string;
  /** The backend serving the trajectory now (changes only on failover). */
  readonly backendId: string;
  /** How many times the trajectory moved to another backend. */
  readonly failovers: number;
  /**
   * The context length of the backend serving the trajectory now (it changes on failover, and engines in one
   * pool may differ); undefined while unknown.
   */
  readonly maxModelLen: number | undefined;
  readonly released: boolean;
  /**
   * The engine request id of the generate call in flight (undefined between calls), so the trajectory's request
   * can be aborted on its engine (EngineClient.abort). Each call gets `<lease uuid>-<n>` unless the caller set one.
   */
  readonly inflightRequestId: string | undefined;
  generate(request: GenerateRequest): Promise<LeaseResult>;
  release(): void;
}

/** What a lease needs from its pool; implemented privately by BackendPool. */
export interface LeaseHost {
  readonly maxFailoversPerRequest: number;
  /** A new backend for a trajectory (counted on it), waiting like `acquire` when none is eligible. */
  assign(signal: AbortSignal | undefined): Promise<BackendState>;
  /**
   * Runs one request on the backend: slot, counters, abort on forced removal (throws BackendGone). `turn` is how
   * many generate calls the trajectory made before this one (the slot queue's priority, see SlotQueue).
   */
  send(backend: BackendState, request: GenerateRequest, turn: number): Promise<GenerateResult>;
  /** The trajectory leaves the backend (release or failover). */
  leave(backend: BackendState, lease: PoolLease): void;
  failedOver(lease: PoolLease, from: BackendState, to: BackendState, why: string): void;
}

/** The pool's lease. Internal: callers see BackendLease. */
export class PoolLease implements BackendLease {
  #backend: BackendState;
  #failovers = 0;
  #released = false;
  #moving: Promise<BackendState> | undefined;
  readonly #idBase = randomUUID();
  #calls = 0;
  #turns = 0;
  #inflightRequestId: string | undefined;

  constructor(
    private readonly host: LeaseHost,
    readonly trajectoryKey: string,
    backend: BackendState,
  ) {
    this.#backend = backend;
  }

  get backendId(): string {
    return this.#backend.id;
  }

  get failovers(): number {
    return this.#failovers;
  }

  get maxModelLen(): number | undefined {
    return this.#backend.maxModelLen;
  }

  get released(): boolean {
    return this.#released;
  }

  get inflightRequestId(): string | undefined {
    return this.#inflightRequestId;
  }

  /** The backend currently holding the trajectory (for the pool's bookkeeping and tests). */
  get backend(): BackendState {
    return this.#backend;
  }

  async generate(request: GenerateRequest): Promise<LeaseResult> {
    const requestId = request.requestId ?? `${this.#idBase}-${this.#calls++}`;
    const turn = this.#turns++;
    this.#inflightRequestId = requestId;
    try {
      return await this.#generate({ ...request, requestId }, turn);
    } finally {
      if (this.#inflightRequestId === requestId) this.#inflightRequestId = undefined;
    }
  }

  async #generate(request: GenerateRequest, turn: number): Promise<LeaseResult> {
    for (let attempt = 0; ; attempt++) {
      if (this.#released) throw new RolloutError('failed_precondition', `lease ${this.trajectoryKey} was released`);
      throwIfAborted(request.signal);
      let backend = this.#backend;
      if (!backend.usable) backend = await this.#failover(backend, request.signal);
      try {
        const result = await this.host.send(backend, request, turn);
        return { ...result, backendId: backend.id, policyVersion: backend.policyVersion, logprobsMode: backend.logprobsMode };
      } catch (err) {
        if (!(err instanceof BackendGone)) throw err;
        if (attempt >= this.host.maxFailoversPerRequest) {
          throw new RolloutError('backend_error', `request of ${this.trajectoryKey} lost its backend ${attempt + 1} times`, {
            cause: err,
          });
        }
      }
    }
  }

  release(): void {
    if (this.#released) return;
    this.#released = true;
    this.host.leave(this.#backend, this);
  }

  /** Moves the trajectory off a backend that can no longer serve it; concurrent callers share one move. */
  #failover(from: BackendState, signal: AbortSignal): Promise<BackendState> {
    this.#moving ??= (async () => {
      try {
        const to = await this.host.assign(signal);
        if (this.#released) {
          this.host.leave(to, this);
          throw new RolloutError('failed_precondition', `lease ${this.trajectoryKey} was released`);
        }
        this.#backend = to;
        this.#failovers++;
        this.host.leave(from, this);
        this.host.failedOver(this, from, to, from.removed ? 'removed' : 'unhealthy');
        return to;
      } finally {
        this.#moving = undefined;
      }
    })();
    return this.#moving;
  }
}
