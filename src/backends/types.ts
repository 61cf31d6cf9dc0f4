/** Sampling settings for one engine call (one assistant turn). */
export interface GenerateRequest {
  /** The whole context as token ids (prompt + response so far): token-in. */
  promptIds: readonly number[];
  maxTokens: number;
  temperature?: number;
  topP?: number;
  topK?: number;
  seed?: number;
  stop?: readonly string[];
  /**
   * The tokenizer's vocabulary size: an answer with an id outside [0, vocabSize) is refused (backend_error).
   * Unchecked when absent.
   */
  vocabSize?: number;
  signal: AbortSignal;
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

export type BackendKind = 'vllm' | 'sglang' | 'embedded';

/**
 * A client for one engine. Implementations: vLLM (/v1/completions with token-id prompts). SGLang and an embedded
 * llama.cpp engine are later implementations of the same interface.
 */
export interface EngineClient {
  readonly kind: BackendKind;
  readonly url: string;
  generate(request: GenerateRequest): Promise<GenerateResult>;
  /** True when the engine answers its health endpoint. */
  health(signal: AbortSignal): Promise<boolean>;
  /**
   * Asks the engine about its model (context length). Throws backend_error when it cannot be learned; the pool
   * then keeps the limit unknown and asks again after the next successful health probe.
   */
  modelInfo?(signal: AbortSignal): Promise<EngineModelInfo>;
  /** Releases connections; called once the pool has removed the backend. */
  close?(): void;
}
