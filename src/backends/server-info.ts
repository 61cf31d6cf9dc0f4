import { EngineHttpError, engineLimit, MAX_INFO_BODY_BYTES, type EngineHttp } from './engine-http.js';
import type { EngineServerInfo, LogprobsMode } from './types.js';

/**
 * Reading what engines say about how they run: their logprobs mode and their capacity. Pure parsers of the
 * engines' own answers (so tests can pin them against recorded ones) plus the one GET both clients share.
 *
 * Followed: vLLM 0.32 (`vllm/entrypoints/serve/dev/server_info/api_router.py`, `vllm/config/model.py`,
 * `vllm/config/scheduler.py`, `vllm/config/parallel.py`) and SGLang v0.5.6+, as the SGLang client
 * (`srt/entrypoints/http_server.py` get_server_info, `srt/managers/scheduler.py` get_internal_state,
 * `srt/layers/sampler.py` with its SGLANG_RETURN_ORIGINAL_LOGPROB switch).
 */

type Json = Record<string, unknown>;

const object = (value: unknown): Json | undefined => (typeof value === 'object' && value !== null && !Array.isArray(value) ? (value as Json) : undefined);
/** A count the engine states, read as at most what any engine can have (see engineLimit); undefined for anything else. */
const positiveInt = engineLimit;

/** vLLM's --logprobs-mode values; the two *_logits modes return logits in the logprobs fields. */
const VLLM_LOGPROBS_MODES: Readonly<Record<string, LogprobsMode | 'logits'>> = {
  raw_logprobs: 'raw',
  processed_logprobs: 'processed',
  raw_logits: 'logits',
  processed_logits: 'logits',
};

/**
 * vLLM's GET /server_info?config_format=json (served with VLLM_SERVER_DEV_MODE=1): `vllm_config` is the whole
 * engine config as JSON. Read from it:
 * - `model_config.logprobs_mode` (--logprobs-mode; vLLM's default raw_logprobs);
 * - `scheduler_config.max_num_seqs` (--max-num-seqs: sequences one engine core runs at once) times the
 *   data-parallel ranks behind this API server (`parallel_config`: all of `data_parallel_size` with the internal load
 *   balancer, the local ones with the hybrid one, one with an external load balancer, where each rank has its own
 *   API server).
 */
export function parseVllmServerInfo(body: unknown): EngineServerInfo {
  const config = object(object(body)?.vllm_config);
  if (config === undefined) return { note: 'GET /server_info has no vllm_config object' };
  const info: EngineServerInfo = {};
  const rawMode = object(config.model_config)?.logprobs_mode;
  const mode = typeof rawMode === 'string' ? VLLM_LOGPROBS_MODES[rawMode] : undefined;
  if (mode === 'logits') info.unsupportedLogprobsMode = rawMode as string;
  else if (mode !== undefined) info.logprobsMode = mode;
  const seqs = positiveInt(object(config.scheduler_config)?.max_num_seqs);
  if (seqs !== undefined) {
    const parallel = object(config.parallel_config) ?? {};
    const ranks = parallel.data_parallel_external_lb === true
      ? 1
      : (positiveInt(parallel.data_parallel_hybrid_lb === true ? parallel.data_parallel_size_local : parallel.data_parallel_size) ?? 1);
    info.maxConcurrency = engineLimit(seqs * ranks)!;
  }
  return info;
}

/**
 * SGLang's GET /get_server_info: the server arguments at the top level, plus `internal_states`, one per
 * data-parallel rank, each with `effective_max_running_requests_per_dp` (the running-request cap the scheduler
 * settled on: --max-running-requests, or what the KV pool allows). Capacity is their sum; without them, the
 * top-level `max_running_requests` when set.
 *
 * The logprobs mode is left unknown: SGLang reports log(softmax(logits / temperature)) — after temperature, before
 * top-p/top-k/min-p — unless the environment variable SGLANG_RETURN_ORIGINAL_LOGPROB is set (then before
 * temperature), and environment variables are not in this answer. Declare it (AddBackend logprobs_mode, config
 * `logprobsMode`) when you know how the engine was started.
 */
export function parseSglangServerInfo(body: unknown): EngineServerInfo {
  const root = object(body);
  if (root === undefined) return { note: 'GET /get_server_info is not a JSON object' };
  const states = Array.isArray(root.internal_states) ? root.internal_states.map(object) : [];
  const perRank = states.map((s) => positiveInt(s?.effective_max_running_requests_per_dp));
  if (perRank.length > 0 && perRank.every((n) => n !== undefined)) return { maxConcurrency: engineLimit(perRank.reduce((a, b) => a! + b!, 0))! };
  const configured = positiveInt(root.max_running_requests);
  return configured !== undefined ? { maxConcurrency: configured } : { note: 'GET /get_server_info states no max running requests' };
}

/**
 * GET `path` and parse it with `parse`. An engine that answers anything but 2xx JSON has said nothing (resolved with
 * a `note`, with `notFoundHint` after a 404; not thrown: asking again would get the same answer); an engine that
 * cannot be reached throws backend_error (asked again later).
 */
export async function fetchServerInfo(
  http: EngineHttp,
  path: string,
  signal: AbortSignal,
  parse: (body: unknown) => EngineServerInfo,
  notFoundHint = '',
): Promise<EngineServerInfo> {
  const { status, text } = await http.request('GET', path, undefined, signal, MAX_INFO_BODY_BYTES);
  if (status < 200 || status >= 300) {
    const body = new EngineHttpError(status, text).message.slice(0, 200);
    return { note: `GET ${path} answered HTTP ${status}${status === 404 && notFoundHint !== '' ? ` (${notFoundHint})` : ''}: ${body}` };
  }
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return { note: `GET ${path} answered with something that is not JSON` };
  }
  return parse(body);
}

/**
 * The tokens an SGLang engine's KV pool holds, from GET /get_server_info: the smallest of the top-level
 * `max_total_num_tokens` (the scheduler info of rank 0) and each data-parallel rank's `memory_usage.token_capacity`
 * (its own pool). Undefined when none is stated. SGLang v0.5.6's scheduler caps every request at
 * min(context_len - 1, max_total_num_tokens - 1) tokens, so below context_len this, not GET /v1/models, is the limit.
 */
export function parseSglangTokenPool(body: unknown): number | undefined {
  const root = object(body);
  if (root === undefined) return undefined;
  const states = Array.isArray(root.internal_states) ? root.internal_states.map(object) : [];
  const stated = [positiveInt(root.max_total_num_tokens), ...states.map((s) => positiveInt(object(s?.memory_usage)?.token_capacity))].filter((n): n is number => n !== undefined);
  return stated.length === 0 ? undefined : Math.min(...stated);
}
