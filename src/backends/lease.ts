import { randomUUID } from 'node:crypto';
import { setTimeout as delay } from 'node:timers/promises';
import { RolloutError, throwIfAborted } from '../errors.js';
import { BackendGone, type BackendState } from './backend-state.js';
import { EngineBusyError } from './generate-answer.js';
import type { GenerateRequest, GenerateResult, LogprobsMode } from './types.js';

/**
 * The policy versions of one engine answer, for the trajectory's turn record. Versions are set by
 * ResumeGeneration (BackendPool.resume) while the engine is paused, so a version can only change under a request
 * that a KEEP pause froze in flight.
 */
export interface SampledVersions {
  /** The backend's policy version when the request was sent. */
  policyVersionStart: number;
  /**
   * The backend's policy version when the answer arrived: the version that sampled its last token. Differs from
   * `policyVersionStart` when the weights changed while the request was in flight (frozen by a KEEP pause), so its
   * tokens mix two versions. (A request that passed the pool's gate just before a pause began and reached the
   * engine only after it may show the same difference without having mixed: the record errs towards "mixed".)
   */
  policyVersion: number;
}

/** A completion plus where it came from, for the trajectory's turn record (backend, policy versions, logprobs mode). */
export interface LeaseResult extends GenerateResult, SampledVersions {
  backendId: string;
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
   * can be aborted on its engine (EngineClient.abort). Each engine request gets `<lease uuid>-<n>` (a retry after a
   * lost backend is a new request with the next n) unless the caller set one.
   */
  readonly inflightRequestId: string | undefined;
  generate(request: GenerateRequest): Promise<LeaseResult>;
  release(): void;
}

/** The longest wait between two requests an engine answered busy. */
const MAX_BUSY_BACKOFF_MS = 8_000;

/** Waits `ms`, or rejects with the signal's reason (cancelled) when it fires first. */
async function abortableDelay(ms: number, signal: AbortSignal | undefined): Promise<void> {
  try {
    await delay(ms, undefined, signal === undefined ? {} : { signal });
  } catch (err) {
    if (signal?.aborted === true) throw RolloutError.from(signal.reason, 'cancelled');
    throw err;
  }
}

/** What a lease needs from its pool; implemented privately by BackendPool. */
export interface LeaseHost {
  readonly maxFailoversPerRequest: number;
  /** How many times one `generate` is asked again after its engine answered busy (HTTP 429/503), and the first wait. */
  readonly maxBusyRetries: number;
  readonly busyBackoffMs: number;
  /** The longest Retry-After of a busy answer that is honoured (longer ones are cut to it). */
  readonly maxRetryAfterMs: number;
  /** A new backend for a trajectory (counted on it), waiting like `acquire` when none is eligible. */
  assign(signal: AbortSignal | undefined): Promise<BackendState>;
  /** Another backend for a trajectory now (counted on it), or undefined when none is free at once (never waits). */
  assignOther(from: BackendState): BackendState | undefined;
  /**
   * Runs one request on the backend: pause gate, slot, counters, abort on forced removal (throws BackendGone, also
   * when the engine could not be reached). `turn` is how many generate calls the trajectory made before this one
   * (the slot queue's priority, see SlotQueue).
   */
  send(backend: BackendState, request: GenerateRequest, turn: number): Promise<GenerateResult & SampledVersions>;
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
    const turn = this.#turns++;
    try {
      return await this.#generate(request, turn);
    } finally {
      this.#inflightRequestId = undefined;
    }
  }

  /**
   * Sends the request, again after each lost backend (removed, unhealthy, unreachable) or answer meant for another
   * request (misdelivered): on the same backend while it is still usable (a dropped connection to a live engine),
   * elsewhere once it is not — or, after a misdelivered answer, as soon as another backend is free (see #moveOff).
   * What a lost request had sampled never arrived (a misdelivered answer is refused whole), so nothing of it is
   * recorded: the retry asks again from the same context. Bounded by
   * `maxFailoversPerRequest`; then backend_error with the last loss as cause. An engine that answers busy (HTTP
   * 429/503: its waiting queue is full, nothing sampled) is asked again after a backoff (doubling from
   * `busyBackoffMs`, at most 8 s), on the same backend unless it has become unusable meanwhile, up to
   * `maxBusyRetries` times; then backend_error saying so. A busy answer's Retry-After (at most `maxRetryAfterMs`) is
   * the least of that wait, and holds every request to that backend until then (BackendState.retryNotBefore): the
   * engine named when it takes requests again, and each request sent sooner would only spend a retry on another 429.
   */
  async #generate(request: GenerateRequest, turn: number): Promise<LeaseResult> {
    let lost: BackendGone | undefined;
    let attempt = 0;
    let busy = 0;
    for (;;) {
      if (this.#released) throw new RolloutError('failed_precondition', `lease ${this.trajectoryKey} was released`);
      throwIfAborted(request.signal);
      let backend = this.#backend;
      if (!backend.usable) backend = await this.#failover(backend, request.signal, lost);
      // The engine said when to ask again (a busy answer's Retry-After, to this trajectory or another one).
      const hold = backend.retryNotBefore - performance.now();
      if (hold > 0) {
        await abortableDelay(hold, request.signal);
        continue;
      }
      const requestId = request.requestId ?? `${this.#idBase}-${this.#calls++}`;
      this.#inflightRequestId = requestId;
      // The caller sized max_tokens for the engine it knew of; the one serving now may leave less room (after a failover
      // to an engine with a shorter context, or once a limit unknown when the turn was sized was learned): the request
      // is lowered to it, and its "length" finish with fewer tokens than asked reads as the context's limit. No room at
      // all is left for the engine to refuse (a context overflow).
      const room = backend.maxModelLen === undefined ? Infinity : backend.maxModelLen - request.promptIds.length;
      const capped = room > 0 && room < request.maxTokens;
      try {
        const result = await this.host.send(backend, { ...request, requestId, ...(capped && { maxTokens: room }) }, turn);
        return { ...result, backendId: backend.id, logprobsMode: backend.logprobsMode };
      } catch (err) {
        if (err instanceof EngineBusyError) {
          if (busy >= this.host.maxBusyRetries) {
            throw new RolloutError('backend_error', `request of ${this.trajectoryKey}: the engine was busy ${busy + 1} times in a row (last: ${err.message})`, { cause: err });
          }
          const hinted = Math.min(err.retryAfterMs ?? 0, this.host.maxRetryAfterMs);
          if (hinted > 0) backend.retryNotBefore = Math.max(backend.retryNotBefore, performance.now() + hinted);
          await abortableDelay(Math.max(Math.min(this.host.busyBackoffMs * 2 ** busy, MAX_BUSY_BACKOFF_MS), hinted), request.signal);
          busy++;
          continue;
        }
        if (!(err instanceof BackendGone)) throw err;
        lost = err;
        if (attempt >= this.host.maxFailoversPerRequest) {
          // A misdelivered answer's own message says what was wrong with it (which id or prompt length it named).
          const detail = err.why === 'misdelivered' && err.cause instanceof Error ? `: ${err.cause.message}` : '';
          throw new RolloutError('backend_error', `request of ${this.trajectoryKey} lost its backend ${attempt + 1} times (last: ${err.message}${detail})`, {
            cause: err,
          });
        }
        attempt++;
        if (err.why === 'misdelivered') this.#moveOff(backend);
      }
    }
  }

  /**
   * After an answer meant for another request (a gateway or proxy in front of the engine mixing answers up, see
   * EngineMisdeliveredError): the trajectory moves to another backend at once when one is free — the fault may well
   * stay with this one, and the engine's cached prefix is worth less than the trajectory — and stays otherwise (the
   * retry goes on a new connection, EngineHttp.exchange having closed the one the answer came on).
   */
  #moveOff(from: BackendState): void {
    if (this.#released || this.#moving !== undefined || this.#backend !== from) return;
    const to = this.host.assignOther(from);
    if (to === undefined) return;
    this.#backend = to;
    this.#failovers++;
    this.host.leave(from, this);
    this.host.failedOver(this, from, to, 'misdelivered');
  }

  release(): void {
    if (this.#released) return;
    this.#released = true;
    this.host.leave(this.#backend, this);
  }

  /**
   * Moves the trajectory off a backend that can no longer serve it; concurrent callers share one move. When no
   * other backend turns up in time, the error says what was lost as well.
   */
  #failover(from: BackendState, signal: AbortSignal, lost: BackendGone | undefined): Promise<BackendState> {
    this.#moving ??= (async () => {
      try {
        let to: BackendState;
        try {
          to = await this.host.assign(signal);
        } catch (err) {
          if (lost === undefined || signal.aborted || !(err instanceof RolloutError)) throw err;
          throw new RolloutError(err.code, `${this.trajectoryKey} lost ${lost.message} and found no other backend: ${err.message}`, { cause: lost });
        }
        if (this.#released) {
          this.host.leave(to, this);
          throw new RolloutError('failed_precondition', `lease ${this.trajectoryKey} was released`);
        }
        this.#backend = to;
        this.#failovers++;
        this.host.leave(from, this);
        this.host.failedOver(this, from, to, from.unusableWhy);
        return to;
      } finally {
        this.#moving = undefined;
      }
    })();
    return this.#moving;
  }
}
