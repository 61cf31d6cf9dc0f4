import type { BackendKind } from './kinds.js';

/**
 * Token ids as engine calls take them: an array, or an Int32Array (the token ledger's context, see
 * TokenLedger.contextIds). Read-only either way.
 */
export type TokenIds = readonly number[] | Int32Array;

/** Sampling settings for one engine call (one assistant turn). */
export interface GenerateRequest {
  /** The whole context as token ids (prompt + response so far): token-in. */
  promptIds: TokenIds;
  maxTokens: number;
  temperature?: number;
  topP?: number;
  topK?: number;
  seed?: number;
  stop?: readonly string[];
  /**
   * Ids that end the turn (the tokenizer's stop tokens: EOS, <|im_end|>, <|eot_id|>, ...). Sent as `stop_token_ids`, so
   * the engine stops at them even when its model's generation_config lists fewer (a base model's <|endoftext|> only);
   * the stopping id stays the answer's last.
   */
  stopTokenIds?: readonly number[];
  /**
   * The tokenizer's vocabulary size: an answer with an id outside [0, vocabSize) is refused (backend_error).
   * Unchecked when absent.
   */
  vocabSize?: number;
  /**
   * The engine-side id of this request (vLLM: `request_id` and the X-Request-Id header; SGLang: `rid`), so the
   * request can be aborted by id ({@link EngineClient.abort}). 1-256 printable ASCII characters, unique among the
   * engine's in-flight requests. The engine makes one up when absent (the request can then only be aborted with
   * everything else).
   */
  requestId?: string;
  signal: AbortSignal;
  /**
   * How long (ms, cumulative) the pool has held this request's engine paused. Time paused does not count against the
   * client's request budget (`requestTimeoutMs`): a request a KEEP pause froze in the engine makes no progress by
   * design, and a weight update longer than what was left of its budget failed every frozen request.
   */
  pausedMs?: () => number;
}

/**
 * What an unset sampling field of a {@link GenerateRequest} means: the model's own distribution (temperature 1, no
 * top-p/top-k/min-p cut, no penalty). Engine clients send these values rather than leaving fields out: vLLM (its
 * default `--generation-config auto`) and SGLang (`--sampling-defaults model`) fill a field a request leaves out
 * from the model's generation_config.json (Qwen3's: temperature 0.6, top-k 20, top-p 0.95), which would sample
 * from another distribution than the trajectory records (and than its logprobs were checked against).
 */
export const NEUTRAL_SAMPLING = { temperature: 1, topP: 1, topK: -1, minP: 0, repetitionPenalty: 1, presencePenalty: 0, frequencyPenalty: 0 } as const;

/**
 * What a pause does with the requests in flight (the contract's PauseGeneration modes):
 * `abort` — they end now with finish_reason "abort" and what was sampled so far;
 * `wait` — the pause completes once they have finished;
 * `keep` — they freeze where they are (KV cache kept) and continue on resume.
 * In every mode new requests wait until {@link EngineClient.resume}.
 */
export type PauseMode = 'abort' | 'wait' | 'keep';

/**
 * Which log-probabilities an engine reports for its sampled tokens. `processed`: those of the distribution the token
 * was drawn from (after temperature; vLLM also after top-p/top-k) — what PPO-style importance ratios need. `raw`:
 * the model's log-softmax before temperature, top-p and top-k (vLLM's default); it equals `processed` only at
 * temperature 1 without top-p/top-k. Unknown is `undefined` wherever a mode is optional.
 */
export type LogprobsMode = 'raw' | 'processed';

/**
 * What an engine says about how it runs (vLLM: dev-mode GET /server_info; SGLang: GET /get_server_info; the
 * embedded engine: its own settings). Every field is undefined when the engine does not say.
 */
export interface EngineServerInfo {
  logprobsMode?: LogprobsMode;
  /** Requests it runs at once (vLLM max_num_seqs per data-parallel rank × ranks; SGLang max running requests). */
  maxConcurrency?: number;
  /**
   * A logprobs mode the rollout server cannot use, as the engine names it (vLLM raw_logits / processed_logits:
   * logits, not log-probabilities); AddBackend refuses such an engine.
   */
  unsupportedLogprobsMode?: string;
  /** Why nothing (or not everything) could be learned, for the log (e.g. "GET /server_info: 404, not in dev mode"). */
  note?: string;
}

/** What an engine says about the model it serves (vLLM: GET /v1/models). */
export interface EngineModelInfo {
  /** Context length: prompt + generated tokens of one request. Undefined when the engine does not say. */
  maxModelLen?: number;
}

/** One engine completion: token-out. Ids and logprobs are used exactly as the engine returned them. */
export interface GenerateResult {
  tokenIds: number[];
  /** Logprob of each sampled token, same length as tokenIds. */
  logprobs: number[];
  finishReason: 'stop' | 'length' | 'abort';
  /** Engine-decoded text (informational; the ledger never re-tokenizes it). */
  text: string;
}

export type { BackendKind };

/** What the pool knows when it asks an engine's health. */
export interface HealthOptions {
  /** The pool paused the engine (PauseGeneration) and has not resumed it yet, or may have (see BackendPool.restoreWeights). */
  paused?: boolean;
}

/**
 * A client for one engine. Implementations: vLLM (/v1/completions with token-id prompts) and SGLang (/generate
 * with input_ids); the kinds and what each can do are enumerated once, in ./kinds.ts. The control operations are
 * optional: a kind without them says so in its capabilities, and callers check before relying on them.
 */
export interface EngineClient {
  readonly kind: BackendKind;
  readonly url: string;
  generate(request: GenerateRequest): Promise<GenerateResult>;
  /**
   * True when the engine answers its health endpoint. `paused`: the pool has paused this engine (or may have, after
   * a restart during a pause); a kind whose health check is itself a generation (SGLang's) cannot pass it then and
   * checks only that the server answers, so a weight sync never marks its engines down.
   */
  health(signal: AbortSignal, options?: HealthOptions): Promise<boolean>;
  /**
   * Asks the engine about its model (context length). Throws backend_error when it cannot be learned; the pool
   * then keeps the limit unknown and asks again after the next successful health probe.
   */
  modelInfo?(signal: AbortSignal): Promise<EngineModelInfo>;
  /**
   * Asks the engine how it runs: its logprobs mode and capacity. An engine that answers but does not say resolves
   * with what it said (and a `note`); throws backend_error only when it cannot be reached, and the pool then asks
   * again after the next successful health probe.
   */
  serverInfo?(signal: AbortSignal): Promise<EngineServerInfo>;
  /**
   * How much work the engine has done, as one number that grows while it works (vLLM, SGLang: its Prometheus token
   * counters, see engine-progress.ts): the pool's stall watchdog (stall-watchdog.ts) reads an engine whose requests
   * have all gone unanswered for a while as hung when this did not move either. Resolves undefined when the engine
   * cannot say (no /metrics, no such counters): no watchdog for it. Throws when it cannot be asked now (inconclusive).
   */
  progress?(signal: AbortSignal): Promise<number | undefined>;
  /**
   * Aborts in-flight requests by {@link GenerateRequest.requestId}, or all of them when `requestIds` is omitted.
   * An aborted request answers its caller with finish_reason "abort" and the tokens sampled so far. Unknown ids are
   * ignored (the request may just have finished). Throws backend_error when the engine refuses.
   */
  abort?(requestIds: readonly string[] | undefined, signal: AbortSignal): Promise<void>;
  /** Pauses generation (see {@link PauseMode}); modes the engine lacks throw invalid_argument (field mode). */
  pause?(mode: PauseMode, signal: AbortSignal): Promise<void>;
  /** Resumes after {@link pause}: waiting and frozen requests continue. */
  resume?(signal: AbortSignal): Promise<void>;
  /** Releases connections; called once the pool has removed the backend. */
  close?(): void;
}
