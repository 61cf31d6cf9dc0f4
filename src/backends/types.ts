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
  signal: AbortSignal;
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
  /** Releases connections; called once the pool has removed the backend. */
  close?(): void;
}
