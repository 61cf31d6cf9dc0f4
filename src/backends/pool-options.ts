import type { Logger } from '../observability/logger.js';
import type { LogprobsMode } from './types.js';
import { DEFAULT_STALL_MS } from './stall-watchdog.js';

export { DEFAULT_STALL_MS };

/** Default of BackendPoolOptions.maxRetryAfterMs. */
export const DEFAULT_MAX_RETRY_AFTER_MS = 60_000;

/** How a BackendPool is tuned and how an engine joins it (the pool's inputs; see BackendPool). */

/** Tuning of a BackendPool; every field has a default suited to a few engines on one cluster. */
export interface BackendPoolOptions {
  /** Root logger; the pool logs through a child `{ component: 'backend-pool' }`. */
  logger?: Logger;
  /** How long `acquire` (and a failover) waits for an eligible backend before failing with backend_error. */
  acquireTimeoutMs?: number;
  /** Health probe period, probe budget and consecutive failures before a backend is marked unhealthy. */
  healthIntervalMs?: number;
  healthTimeoutMs?: number;
  healthFailureThreshold?: number;
  /** How many times one `generate` may lose its backend and retry elsewhere before giving up. */
  maxFailoversPerRequest?: number;
  /**
   * How many times one `generate` is asked again after its engine answered busy (HTTP 429 or 503: a full waiting
   * queue, nothing sampled; default 8), waiting `busyBackoffMs` (default 250) doubling up to 8 s in between: about
   * 40 s in all before the sample ends BACKEND_ERROR.
   */
  maxBusyRetries?: number;
  busyBackoffMs?: number;
  /**
   * The longest Retry-After of a busy answer honoured (default {@link DEFAULT_MAX_RETRY_AFTER_MS}, 60 s): the engine is
   * asked again no sooner than its Retry-After — by every request to it, not only the one answered — but never later
   * than this after the answer, so an engine (or gateway) asking for an hour cannot hold its trajectories that long.
   */
  maxRetryAfterMs?: number;
  /** Budget of one attempt to learn an engine's limits (GET /v1/models, server info) when it is added or probed. */
  modelInfoTimeoutMs?: number;
  /** The capacity of a backend whose max concurrency is neither configured nor reported by its engine (default 256). */
  defaultMaxConcurrency?: number;
  /**
   * Which request waiting for a backend's slot goes first. `turns` (default): the one whose trajectory has run the
   * most turns, arrival order among equals — long trajectories end the step, so their turns go first (see
   * SlotQueue); `fifo`: arrival order only.
   */
  queueOrder?: 'turns' | 'fifo';
  /**
   * How long an ABORT pause waits for the requests it aborted to come back with their partial tokens before it
   * answers anyway (a request that reached the engine only after the engine paused is held there until resume).
   */
  pauseAbortGraceMs?: number;
  /**
   * A backend that comes back healthy after it was down, while it serves a policy version other than 0, is held (its
   * gate closed) until the trainer's next ResumeGeneration reaches it (default true): the engine may have been
   * restarted, from the base checkpoint or another one, and its tokens would be recorded with weights it no longer
   * serves — off-policy samples labelled on-policy. Nothing tells a restart from a network blip (engines report no
   * weight version), so the hold costs a blip at most one weight-sync step of that engine's capacity. At version 0
   * (weights never updated) a restarted engine serves what it always did, and it is not held. A held engine takes no
   * trajectory (BackendState.weightsUnknown): with no other engine, trajectories end backend_error after
   * `acquireTimeoutMs` rather than wait for a resume a trainer sends only once its rollouts are done. Not held: one
   * back while a pause is in effect on it (that pause's resume confirms it), and a hung engine whose work counters went
   * on from where they stood with no version change meanwhile (the same process: see the StallWatchdog's onMoved).
   */
  holdRecoveredBackends?: boolean;
  /**
   * Bytes of engine answers buffered at once across every engine of the pool (default 1 GiB): the engine clients given
   * BackendPool.responseBudget read an answer's body only once it has room (see ResponseBudget).
   */
  maxBufferedResponseBytes?: number;
  /**
   * An engine whose requests have all gone unanswered this long while its work counters (Prometheus /metrics) stood
   * still is hung: its requests move to other engines and it takes none until its counters move (see StallWatchdog).
   * Default {@link DEFAULT_STALL_MS} (60 s); 0 disables. Runs with the health checks (startHealthChecks).
   */
  stallMs?: number;
}

/** The pool-wide weight-sync state: a pool-wide pause in effect, and the version set for the whole pool. */
export interface PoolWeights {
  paused: boolean;
  policyVersion: number;
}

/** How a new engine joins the pool (AddBackend's fields once the client is built). */
export interface AddBackendOptions {
  /** Unique id; defaults to `backend-<n>`. */
  id?: string;
  /**
   * Requests run at once on this engine; more wait in its slot queue. Absent or 0: what the engine reports
   * (BackendPool.learn), the pool's default until it does (or if it never does).
   */
  maxConcurrency?: number;
  /**
   * The engine's logprobs mode when the caller knows it; otherwise learned where the engine says. When both are
   * known and differ, BackendPool.checkEngineAgrees refuses the backend.
   */
  logprobsMode?: LogprobsMode;
  /** Model name the engine serves (sent as `model` by clients that need it). */
  model: string;
  /** The policy version the engine serves; default: the last version set for the whole pool (0 at first). */
  policyVersion?: number;
  /** Starts healthy unless told otherwise (e.g. when the caller wants the first probe to decide). */
  healthy?: boolean;
  /** The engine's context length when already known; otherwise it is asked (see BackendPool.learn). */
  maxModelLen?: number;
}
