import { RolloutError } from '../errors.js';
import { EngineHttpError, type EngineHttp } from './engine-http.js';

/**
 * The Prometheus counters that move whenever an engine does work: tokens prefilled and tokens generated. A hung engine
 * (its scheduler or a GPU worker stuck, its HTTP server — /health included — still answering) moves neither; an engine
 * working on a long generation moves the generation counter at every step. vLLM: `vllm:prompt_tokens` and
 * `vllm:generation_tokens` (Counters of vllm/v1/metrics/loggers.py, exported with the `_total` suffix; the prompt count
 * is added when a request's prefill is done). SGLang (with --enable-metrics; without it /metrics is a 404):
 * `sglang:prompt_tokens_total` and `sglang:generation_tokens_total` (its documented production metrics).
 */
export const VLLM_PROGRESS_COUNTERS = ['vllm:prompt_tokens_total', 'vllm:generation_tokens_total'] as const;
export const SGLANG_PROGRESS_COUNTERS = ['sglang:prompt_tokens_total', 'sglang:generation_tokens_total'] as const;

/** A /metrics answer larger than this is not read (vLLM's is tens of KiB; a LoRA-heavy one a few hundred). */
export const MAX_METRICS_BODY_BYTES = 8 << 20;

/**
 * The sum of every sample of the named metrics in a Prometheus text exposition (`name{labels} value [timestamp]`, one
 * per line, `#` lines skipped), over all their label sets (per model, per engine rank); undefined when none of them
 * appears with a finite value. Only the sum's changes matter (see StallWatchdog), so the counters are not told apart.
 */
export function sumCounters(text: string, names: readonly string[]): number | undefined {
  let sum: number | undefined;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const name = /^[A-Za-z_:][A-Za-z0-9_:]*/.exec(line)?.[0];
    if (name === undefined || !names.includes(name)) continue;
    let rest = line.slice(name.length);
    if (rest.startsWith('{')) {
      const close = rest.lastIndexOf('}');
      if (close < 0) continue;
      rest = rest.slice(close + 1);
    }
    const value = Number(rest.trim().split(/\s+/)[0]);
    if (rest.trim() === '' || !Number.isFinite(value)) continue;
    sum = (sum ?? 0) + value;
  }
  return sum;
}

/**
 * GET /metrics and {@link sumCounters} of `names` (EngineClient.progress). Undefined when the engine serves no such
 * counters: a 4xx (no /metrics: SGLang without --enable-metrics, a gateway), an answer without them (not Prometheus
 * text, another engine); the watchdog then leaves the engine alone. Throws when the engine cannot say now (unreachable,
 * out of time, a 5xx, an answer too large): inconclusive, asked again later.
 */
export async function fetchProgress(http: EngineHttp, names: readonly string[], signal: AbortSignal): Promise<number | undefined> {
  const { status, text } = await http.request('GET', '/metrics', undefined, signal, MAX_METRICS_BODY_BYTES);
  if (status >= 400 && status < 500) return undefined;
  if (status < 200 || status >= 300) {
    throw new RolloutError('backend_error', `${http.label} ${http.url} answered HTTP ${status} to GET /metrics`, { cause: new EngineHttpError(status, text) });
  }
  return sumCounters(text, names);
}
