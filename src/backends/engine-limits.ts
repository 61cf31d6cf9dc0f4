import { RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import { BackendGone, type BackendState, type CapacitySource, type RefusalWhy } from './backend-state.js';
import { ModelNotServedError } from './engine-http.js';
import type { EngineServerInfo } from './types.js';

/** What the learner needs of its pool: settings, its log, and the routing heap through which keys change. */
export interface LimitLearnerHost {
  readonly log: Logger;
  /** Budget of one attempt to ask an engine (GET /v1/models, server info). */
  readonly modelInfoTimeoutMs: number;
  /** The capacity of a backend whose engine stopped reporting one. */
  readonly defaultMaxConcurrency: number;
  /** Applies `change` to a backend's heap keys (eligibility, capacity) through the pool's heap. */
  rekey(backend: BackendState, change: (b: BackendState) => void): void;
  /** Hands backends that became eligible to waiting acquires. */
  wake(): void;
}

/**
 * Learning what an engine says about itself — its context length and whether it serves the backend's model (vLLM,
 * SGLang: GET /v1/models, SGLang also its token pool), how it runs (EngineClient.serverInfo: logprobs mode, capacity)
 * — and refusing an engine whose answers must not be used (another model, logits for logprobs). The pool decides
 * when to ask (see BackendPool.learn); this decides what an answer changes.
 *
 * Invariants: what was configured is never asked or overwritten; an engine that cannot be reached changes nothing
 * (asked again later); a refused backend is neither eligible nor usable, and its queued and running requests move.
 */
export class LimitLearner {
  constructor(private readonly host: LimitLearnerHost) {}

  /** Asks what {@link needsLearning} says is unknown or stale; concurrent calls share one attempt. Never throws. */
  learn(backend: BackendState): Promise<void> {
    backend.learning ??= (async () => {
      try {
        await Promise.all([this.#learnModelInfo(backend), this.#learnServerInfo(backend)]);
      } finally {
        backend.learning = undefined;
      }
    })();
    return backend.learning;
  }

  /**
   * Throws when the engine contradicts what was declared about it: its refusal (another model: invalid_argument field
   * model; logits: failed_precondition), or invalid_argument (field logprobs_mode) when it reports another logprobs
   * mode than declared.
   */
  checkAgrees(backend: BackendState): void {
    const refusal = backend.refusal;
    if (refusal !== undefined) throw refusal;
    const reported = backend.serverInfo?.logprobsMode;
    const declared = backend.declaredLogprobsMode;
    if (declared !== undefined && reported !== undefined && reported !== declared) {
      throw RolloutError.invalid('logprobs_mode', `declared ${declared}, but engine ${backend.client.url} reports ${reported} logprobs`);
    }
  }

  setMaxModelLen(backend: BackendState, maxModelLen: number, source: string): void {
    if (backend.maxModelLen === maxModelLen) return;
    this.host.log.info({ backend: backend.id, maxModelLen, previous: backend.maxModelLen, source }, 'backend max_model_len learned');
    backend.maxModelLen = maxModelLen;
  }

  /** Changes a backend's capacity: a heap key (re-seated through rekey) and its slot queue's limit. */
  setCapacity(backend: BackendState, capacity: number, source: CapacitySource): void {
    if (backend.maxConcurrency === capacity && backend.capacitySource === source) return;
    this.host.log.info({ backend: backend.id, maxConcurrency: capacity, previous: backend.maxConcurrency, source }, 'backend capacity learned');
    this.host.rekey(backend, (b) => {
      b.maxConcurrency = capacity;
      b.capacitySource = source;
    });
    backend.slots.resize(capacity);
  }

  async #learnModelInfo(backend: BackendState): Promise<void> {
    const { log } = this.host;
    const modelInfo = backend.client.modelInfo?.bind(backend.client);
    if (modelInfo === undefined || !asksModelInfo(backend)) return;
    // Cleared as the engine is asked: a restart noticed while it answers sets it again, for the next attempt.
    const stale = backend.modelInfoStale;
    backend.modelInfoStale = false;
    let maxModelLen: number | undefined;
    try {
      ({ maxModelLen } = await modelInfo(AbortSignal.timeout(this.host.modelInfoTimeoutMs)));
    } catch (err) {
      if (stale) backend.modelInfoStale = true;
      if (err instanceof ModelNotServedError) {
        if (!backend.removed) this.#setRefusal(backend, 'not serving its model', err);
        return;
      }
      log.warn({ backend: backend.id, err }, 'could not learn max_model_len; retried after the next health probe');
      return;
    }
    if (backend.removed) return;
    this.#setRefusal(backend, 'not serving its model', undefined);
    if (maxModelLen !== undefined) {
      this.setMaxModelLen(backend, maxModelLen, 'engine model info');
      return;
    }
    if (backend.maxModelLen !== undefined) {
      // Asked again (it came back from being down): a limit learned before is forgotten, not carried over to an engine
      // that no longer states one.
      log.info({ backend: backend.id, previous: backend.maxModelLen }, 'backend max_model_len no longer stated: forgotten');
      backend.maxModelLen = undefined;
    }
    log.warn({ backend: backend.id }, 'engine does not state max_model_len; context overflow is caught from its answers');
  }

  async #learnServerInfo(backend: BackendState): Promise<void> {
    const { log } = this.host;
    const serverInfo = backend.client.serverInfo?.bind(backend.client);
    if (serverInfo === undefined || (backend.serverInfo !== undefined && !backend.serverInfoStale)) return;
    const stale = backend.serverInfoStale;
    backend.serverInfoStale = false;
    let reported: EngineServerInfo;
    try {
      reported = await serverInfo(AbortSignal.timeout(this.host.modelInfoTimeoutMs));
    } catch (err) {
      if (stale) backend.serverInfoStale = true;
      log.warn({ backend: backend.id, err }, 'could not ask the engine its logprobs mode and capacity; retried after the next health probe');
      return;
    }
    if (backend.removed) return;
    backend.serverInfo = reported;
    const { logprobsMode, maxConcurrency, unsupportedLogprobsMode, note } = reported;
    log.info({ backend: backend.id, logprobsMode, maxConcurrency, unsupportedLogprobsMode, note }, 'engine server info');
    if (maxConcurrency !== undefined && backend.capacitySource !== 'configured') this.setCapacity(backend, maxConcurrency, 'engine');
    // Asked again and no longer reported: the engine's earlier capacity is not carried over.
    else if (maxConcurrency === undefined && backend.capacitySource === 'engine') this.setCapacity(backend, this.host.defaultMaxConcurrency, 'default');
    const declared = backend.declaredLogprobsMode;
    if (declared !== undefined && logprobsMode !== undefined && declared !== logprobsMode) {
      log.error({ backend: backend.id, declared, reported: logprobsMode }, 'engine contradicts the declared logprobs mode; trajectories record what it reports');
    }
    // Logits recorded as logprobs would corrupt every ratio computed from them: the engine is refused until it says otherwise.
    const logits = unsupportedLogprobsMode === undefined
      ? undefined
      : new RolloutError('failed_precondition', `engine ${backend.client.url} reports --logprobs-mode ${unsupportedLogprobsMode}: logits, not ` +
          'log-probabilities; start it with --logprobs-mode processed_logprobs');
    this.#setRefusal(backend, 'returning logits', logits);
  }

  /**
   * Records whether the engine may serve (see BackendState.modelRefusal, modeRefusal). An engine refused takes no more
   * trajectories, and those on it move (as from an unhealthy backend); one whose refusals are all lifted takes
   * trajectories again.
   */
  #setRefusal(backend: BackendState, why: RefusalWhy, refusal: RolloutError | undefined): void {
    const { log } = this.host;
    const set = (b: BackendState): void => {
      if (why === 'not serving its model') b.modelRefusal = refusal;
      else b.modeRefusal = refusal;
    };
    const was = why === 'not serving its model' ? backend.modelRefusal : backend.modeRefusal;
    if ((was === undefined) === (refusal === undefined)) return set(backend);
    this.host.rekey(backend, set);
    if (refusal === undefined) {
      log.warn({ backend: backend.id, why }, 'engine refusal lifted');
      if (backend.refusal === undefined) this.host.wake();
      return;
    }
    log.error({ backend: backend.id, err: refusal, why }, 'engine refused: no trajectory goes to it');
    const gone = new BackendGone(backend.id, why);
    backend.gate.rejectAll(gone);
    backend.slots.rejectAll(gone);
    for (const request of backend.requests) request.controller.abort(gone);
  }
}

/** Something the engine may still be able to tell, or tell otherwise than before (see BackendPool.learn). */
export function needsLearning(b: BackendState): boolean {
  return (b.client.modelInfo !== undefined && asksModelInfo(b)) || (b.client.serverInfo !== undefined && (b.serverInfo === undefined || b.serverInfoStale));
}

/** Whether the engine's model card is to be asked: not configured, and unknown, possibly changed, or not served. */
function asksModelInfo(b: BackendState): boolean {
  return !b.maxModelLenConfigured && (b.maxModelLen === undefined || b.modelInfoStale || b.modelRefusal !== undefined);
}

/** What ListBackends says of a refusal: a ModelNotServedError's reason without its field, else the message. */
export function refusalText(refusal: RolloutError | undefined): string | undefined {
  if (refusal === undefined) return undefined;
  return refusal instanceof ModelNotServedError ? refusal.reason : refusal.message;
}
