import type { EngineModel } from './sim-engine.js';

/**
 * The default heterogeneous fleet: two large engines (64 sequences) and two small ones (16). Both kinds decode a
 * full batch at the same per-sequence speed (75 tokens/s) — the large ones simply hold four times as many — and
 * prefill an uncached prompt token at a quarter of a decode token's cost. Prefix caches hold ~23k tokens per
 * sequence slot, enough for the trajectories a balanced engine carries, not for a pile-up.
 */
export function defaultEngines(): EngineModel[] {
  const large = { maxSequences: 64, peakTokensPerSecond: 6000, halfBatch: 16, prefillCostPerToken: 0.25, cacheTokens: 1_500_000 };
  const small = { maxSequences: 16, peakTokensPerSecond: 1500, halfBatch: 4, prefillCostPerToken: 0.25, cacheTokens: 375_000 };
  return [
    { id: 'large-0', ...large },
    { id: 'large-1', ...large },
    { id: 'small-0', ...small },
    { id: 'small-1', ...small },
  ];
}
