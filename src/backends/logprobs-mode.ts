import type { BackendKind } from './kinds.js';
import type { GenerateRequest, LogprobsMode } from './types.js';

/**
 * Why an engine's logprobs are not those of the distribution `request` samples from (so PPO-style ratios computed
 * from them would be off), or undefined when they are or when it cannot be told (mode unknown).
 *
 * - `raw` logprobs (vLLM's default) are the model's log-softmax before temperature, top-p and top-k: they differ as
 *   soon as the temperature is not 1 or top-p/top-k cut the distribution.
 * - SGLang's `processed` logprobs are after temperature but before top-p/top-k (src/backends/server-info.ts), so
 *   they still differ when top-p/top-k cut. vLLM's processed_logprobs and the embedded engine's include the cut.
 *
 * Unset sampling fields are neutral (NEUTRAL_SAMPLING: temperature 1, no top-p, no top-k), as the clients send them.
 */
export function logprobsMismatch(kind: BackendKind, mode: LogprobsMode | undefined, request: Pick<GenerateRequest, 'temperature' | 'topP' | 'topK'>): string | undefined {
  const tempered = request.temperature !== undefined && request.temperature !== 1;
  const cut = (request.topP !== undefined && request.topP < 1) || (request.topK !== undefined && request.topK > 0);
  if (mode === 'raw' && (tempered || cut)) {
    return 'the engine reports raw logprobs (before temperature, top-p and top-k) but requests sample with ' +
      `${describe(request)}: they are not the sampling distribution's (vLLM: --logprobs-mode processed_logprobs)`;
  }
  if (mode === 'processed' && kind === 'sglang' && cut) {
    return `SGLang's logprobs are after temperature but before top-p/top-k, and requests sample with ${describe(request)}`;
  }
  return undefined;
}

function describe(request: Pick<GenerateRequest, 'temperature' | 'topP' | 'topK'>): string {
  const parts: string[] = [];
  if (request.temperature !== undefined) parts.push(`temperature ${request.temperature}`);
  if (request.topP !== undefined) parts.push(`top_p ${request.topP}`);
  if (request.topK !== undefined) parts.push(`top_k ${request.topK}`);
  return parts.join(', ');
}
