import { RolloutError } from '../errors.js';
import type { BackendKind, EngineClient } from './types.js';
import { VllmClient } from './vllm-client.js';

export interface EngineClientOptions {
  /** Budget of one generate request (see VllmClientOptions.requestTimeoutMs). 0 = none. */
  requestTimeoutMs?: number;
  /** Cap on a completion body in bytes (see VllmClientOptions.maxResponseBytes). 0 = derived per request. */
  maxResponseBytes?: number;
}

/**
 * Builds the client for an engine kind, so AddBackend and the CLI do not need to know the implementations.
 * Only vLLM exists today; SGLang and the embedded engine are later implementations of the same interface and
 * are refused with invalid_argument (field `kind`) until then.
 */
export function createEngineClient(kind: BackendKind, url: string, model: string, options: EngineClientOptions = {}): EngineClient {
  switch (kind) {
    case 'vllm':
      return new VllmClient({ url, model, requestTimeoutMs: options.requestTimeoutMs ?? 0, maxResponseBytes: options.maxResponseBytes ?? 0 });
    case 'sglang':
    case 'embedded':
      throw RolloutError.invalid('kind', `${kind} backends are not supported yet`);
  }
}
