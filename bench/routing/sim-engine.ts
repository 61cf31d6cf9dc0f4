import type { BackendKind, EngineClient, GenerateRequest, GenerateResult } from '../../src/backends/types.js';
import { PrefixCache } from './prefix-cache.js';
import type { VirtualClock, TimerHandle } from './virtual-clock.js';

/** An engine's capacity model (a GPU server running continuous batching). */
export interface EngineModel {
  id: string;
  /** Sequences it runs at once (vLLM max_num_seqs); also the pool's max concurrency for it. */
  maxSequences: number;
  /**
   * Decode throughput curve: with n sequences running the engine makes `peakTokensPerSecond · n / (n + halfBatch)`
   * tokens/s, shared equally, so each sequence's speed `peak / (n + halfBatch)` falls as the batch grows.
   */
  peakTokensPerSecond: number;
  halfBatch: number;
  /** Cost of one uncached prompt token, in decode-token equivalents (prefill is cheaper per token than decode). */
  prefillCostPerToken: number;
  /** KV tokens the prefix cache can keep. */
  cacheTokens: number;
}

/** How the simulation tells the engine what a request is (the pool passes requests through untouched). */
export interface TurnLookup {
  /** The trajectory index and prompt length of a request (its promptIds carry only the trajectory index). */
  describe(request: GenerateRequest): { trajectory: number; promptTokens: number };
  /** The engine that served the trajectory's previous turn; updated by the engine that serves this one. */
  lastEngine: Map<number, SimEngine>;
}

interface Running {
  readonly trajectory: number;
  readonly promptTokens: number;
  readonly outputTokens: number;
  /** Per-sequence service (tokens) at which it finishes. */
  readonly target: number;
  readonly resolve: (result: GenerateResult) => void;
}

/** What the simulator checks and reports per engine. */
export interface EngineCounters {
  requests: number;
  outputTokens: number;
  promptTokens: number;
  cachedTokens: number;
  /** ∫ running sequences dt: busy sequence-seconds. */
  busySequenceSeconds: number;
  maxRunning: number;
  /** Requests that arrived while all sequences were taken (must stay 0: routers gate at max concurrency). */
  overCapacity: number;
  /** Cache hits for a trajectory whose previous turn ran elsewhere (must stay 0). */
  hitsOffSticky: number;
}

/**
 * A simulated engine behind the real EngineClient interface, so the production pool can route to it. Requests
 * are served by processor sharing in virtual time: each needs `outputTokens + prefillCost · uncachedPromptTokens`
 * units of service and all running ones progress at the same per-sequence speed. Answers carry the turn's length
 * in placeholder ids (their values do not matter to routing; the simulation knows each turn's length).
 */
export class SimEngine implements EngineClient {
  readonly kind: BackendKind = 'vllm';
  readonly url: string;
  readonly cache: PrefixCache;
  readonly counters: EngineCounters = { requests: 0, outputTokens: 0, promptTokens: 0, cachedTokens: 0, busySequenceSeconds: 0, maxRunning: 0, overCapacity: 0, hitsOffSticky: 0 };
  readonly #running = new Set<Running>();
  #served = 0;
  #lastUpdate = 0;
  #next: TimerHandle | undefined;

  constructor(readonly model: EngineModel, private readonly clock: VirtualClock, private readonly turns: TurnLookup) {
    this.url = `sim://${model.id}`;
    this.cache = new PrefixCache(model.cacheTokens);
  }

  get id(): string {
    return this.model.id;
  }

  get running(): number {
    return this.#running.size;
  }

  generate(request: GenerateRequest): Promise<GenerateResult> {
    const { trajectory, promptTokens } = this.turns.describe(request);
    this.#advance();
    if (this.#running.size >= this.model.maxSequences) this.counters.overCapacity++;
    const sticky = this.turns.lastEngine.get(trajectory) === this;
    const cached = Math.min(promptTokens, this.cache.lookup(trajectory));
    if (cached > 0 && !sticky) this.counters.hitsOffSticky++;
    this.counters.requests++;
    this.counters.outputTokens += request.maxTokens;
    this.counters.promptTokens += promptTokens;
    this.counters.cachedTokens += cached;
    const work = request.maxTokens + this.model.prefillCostPerToken * (promptTokens - cached);
    return new Promise((resolve) => {
      this.#running.add({ trajectory, promptTokens, outputTokens: request.maxTokens, target: this.#served + work, resolve });
      this.counters.maxRunning = Math.max(this.counters.maxRunning, this.#running.size);
      this.#schedule();
    });
  }

  async health(): Promise<boolean> {
    return true;
  }

  /** Busy sequence-seconds up to the clock's present (a snapshot for phase figures). */
  busyNow(): number {
    this.#advance();
    return this.counters.busySequenceSeconds;
  }

  /** The trajectory ended: its prefix is of no further use. */
  forget(trajectory: number): void {
    this.cache.drop(trajectory);
  }

  #speed(): number {
    return this.model.peakTokensPerSecond / (this.#running.size + this.model.halfBatch);
  }

  /** Brings per-sequence service and busy time up to the clock. */
  #advance(): void {
    const dt = this.clock.now - this.#lastUpdate;
    if (dt > 0 && this.#running.size > 0) {
      this.#served += this.#speed() * dt;
      this.counters.busySequenceSeconds += this.#running.size * dt;
    }
    this.#lastUpdate = this.clock.now;
  }

  #schedule(): void {
    this.#next?.cancel();
    this.#next = undefined;
    let first: number | undefined;
    for (const r of this.#running) if (first === undefined || r.target < first) first = r.target;
    if (first === undefined) return;
    this.#next = this.clock.after(Math.max(0, first - this.#served) / this.#speed(), () => this.#complete());
  }

  #complete(): void {
    this.#advance();
    const done = [...this.#running].filter((r) => r.target <= this.#served + 1e-6);
    for (const r of done) {
      this.#running.delete(r);
      const previous = this.turns.lastEngine.get(r.trajectory);
      if (previous !== undefined && previous !== this) previous.forget(r.trajectory);
      this.turns.lastEngine.set(r.trajectory, this);
      this.cache.insert(r.trajectory, r.promptTokens + r.outputTokens);
      // The turn's length in ids (their values do not matter), ended at its max_tokens: what a real engine answers,
      // so the pool's checks of an answer (a 'length' stop short of both limits is refused) see a well-formed one.
      r.resolve({ tokenIds: new Array<number>(r.outputTokens).fill(0), logprobs: new Array<number>(r.outputTokens).fill(0), finishReason: 'length', text: '' });
    }
    this.#schedule();
  }
}
