import { RolloutError } from '../errors.js';
import { EmbeddedEngineClient } from './embedded/embedded-engine.js';
import type { BackendKind, EngineClient } from './types.js';
import { VllmClient } from './vllm-client.js';

export interface EngineClientOptions {
  /** Budget of one generate request (see VllmClientOptions.requestTimeoutMs). 0 = none. */
  requestTimeoutMs?: number;
  /** Cap on a completion body in bytes (see VllmClientOptions.maxResponseBytes). 0 = derived per request. */
  maxResponseBytes?: number;
  /** The backend's max concurrency: the embedded engine's sequences when its URL does not say. */
  maxConcurrency?: number;
}

/**
 * Builds the client for an engine kind, so AddBackend and the CLI do not need to know the implementations.
 * vLLM takes an http(s) base URL; the embedded llama.cpp engine a `file:///path/model.gguf` or
 * `embedded://tiny-qwen3` URL (see embedded/embedded-url.ts) and starts loading its model at once. SGLang is a
 * later implementation of the same interface and is refused with invalid_argument (field `kind`) until then.
 */
export function createEngineClient(kind: BackendKind, url: string, model: string, options: EngineClientOptions = {}): EngineClient {
  switch (kind) {
    case 'vllm':
      return new VllmClient({ url, model, requestTimeoutMs: options.requestTimeoutMs ?? 0, maxResponseBytes: options.maxResponseBytes ?? 0 });
    case 'embedded':
      return new EmbeddedEngineClient({ url, ...(options.maxConcurrency !== undefined && { maxConcurrency: options.maxConcurrency }) });
    case 'sglang':
      throw RolloutError.invalid('kind', `${kind} backends are not supported yet`);
  }
}
