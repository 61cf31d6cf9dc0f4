import type { BackendState, CapacitySource } from './backend-state.js';
import { refusalText } from './engine-limits.js';
import type { BackendKind, LogprobsMode } from './types.js';

/** What the pool shows of itself (ListBackends, Watch stats, metrics): frozen snapshots, never its live state. */

/** A read-only view of one backend, as ListBackends reports it. */
export interface BackendInfo {
  readonly id: string;
  readonly url: string;
  readonly kind: BackendKind;
  readonly model: string;
  readonly maxConcurrency: number;
  /** Its engine answers its health checks (see {@link refusal} for an engine that answers but must not serve). */
  readonly healthy: boolean;
  /**
   * Why the engine, though it may answer its health checks, takes no trajectories: it serves another model (and which
   * it serves), or returns logits for logprobs. Undefined while nothing refuses it.
   */
  readonly refusal: string | undefined;
  readonly draining: boolean;
  /** Generation paused (PauseGeneration): its requests wait in the pool until resumed. */
  readonly paused: boolean;
  readonly inflightTrajectories: number;
  /** Requests routed here and not finished: running plus `queuedRequests`. */
  readonly inflightRequests: number;
  readonly queuedRequests: number;
  readonly assignedTotal: number;
  /** Trajectories that had to move off this backend. */
  readonly failovers: number;
  /**
   * Answers of this engine refused as meant for another request (another prompt length or id: a gateway or proxy
   * mixing answers up); each such request was asked again (see EngineMisdeliveredError).
   */
  readonly misdeliveredAnswers: number;
  /** Found hung now: unanswered requests and still work counters (see BackendState.stalled); `healthy` is false then. */
  readonly stalled: boolean;
  /** Times its engine was found hung (each time its trajectories moved to other engines). */
  readonly stalls: number;
  /**
   * Back after it was down (or hung) while serving a policy version other than 0: it takes no trajectory until a
   * ResumeGeneration confirms its weights (see BackendState.weightsUnknown). `healthy` may be true meanwhile (it answers).
   */
  readonly weightsUnknown: boolean;
  readonly policyVersion: number;
  /** The engine's context length (prompt + generated tokens); undefined while unknown. */
  readonly maxModelLen: number | undefined;
  /** Where `maxConcurrency` came from: configured, reported by the engine, or the pool's default. */
  readonly capacitySource: CapacitySource;
  /** The logprobs trajectories record for turns sampled here (see BackendState.logprobsMode); undefined = unknown. */
  readonly logprobsMode: LogprobsMode | undefined;
}

/** Pool-wide totals for Watch and metrics; `leases` and `waitingAcquires` make leaks and stalls visible. */
export interface PoolStats {
  backends: number;
  /** Backends that answer their health checks and are not refused (see BackendInfo.refusal). */
  healthy: number;
  /** Backends that may take new trajectories (healthy, not draining). */
  eligible: number;
  inflightTrajectories: number;
  inflightRequests: number;
  queuedRequests: number;
  assignedTotal: number;
  failovers: number;
  /** Leases not yet released (a leak shows here). */
  leases: number;
  /** `acquire` calls waiting for an eligible backend. */
  waitingAcquires: number;
}

/** A frozen snapshot of `b` as ListBackends reports it. */
export function backendInfo(b: BackendState): BackendInfo {
  return Object.freeze({
    id: b.id, url: b.client.url, kind: b.client.kind, model: b.model, maxConcurrency: b.maxConcurrency, healthy: b.healthy,
    refusal: refusalText(b.refusal), draining: b.draining, paused: b.paused, inflightTrajectories: b.inflightTrajectories, inflightRequests: b.inflightRequests,
    queuedRequests: b.slots.waiting, assignedTotal: b.assignedTotal, failovers: b.failoversOut, misdeliveredAnswers: b.misdeliveredAnswers, stalled: b.stalled, stalls: b.stalls, weightsUnknown: b.weightsUnknown, policyVersion: b.policyVersion,
    maxModelLen: b.maxModelLen, capacitySource: b.capacitySource, logprobsMode: b.logprobsMode,
  });
}
