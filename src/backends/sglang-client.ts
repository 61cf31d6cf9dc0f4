import { bodyWithIds } from './prompt-json.js';
import { RolloutError } from '../errors.js';
import { parseSglangContextOverflow } from './context-overflow.js';
import { readGenerateAnswer, type GenerateAnswerKind } from './generate-answer.js';
import { checkRequestId, EngineHttp, MAX_INFO_BODY_BYTES, modelCardMaxLen, probeHealth } from './engine-http.js';
import { checkSglangGenerate } from './sglang-answer.js';
import { fetchProgress, SGLANG_PROGRESS_COUNTERS } from './engine-progress.js';
import type { ResponseBudget } from './response-budget.js';
import { fetchServerInfo, parseSglangServerInfo, parseSglangTokenPool } from './server-info.js';
import { NEUTRAL_SAMPLING, type EngineClient, type EngineModelInfo, type EngineServerInfo, type GenerateRequest, type GenerateResult, type HealthOptions, type PauseMode } from './types.js';
import { defaultMaxResponseBytes } from './vllm-client.js';

/** Where an SGLang server is and how long one request may take (the same knobs as the vLLM client). */
export interface SglangClientOptions {
  /** Base URL of the server (e.g. `http://gpu-node-3:30000`). */
  url: string;
  /** Served model name (`--served-model-name`): picks the card in GET /v1/models. /generate has no model field. */
  model: string;
  /** Budget of one generate request; past it the request is aborted and fails with backend_error. 0 = none. */
  requestTimeoutMs?: number;
  /** How long an answer's body may stall after its headers (see EngineHttpOptions.bodyIdleTimeoutMs). Default 30 s. */
  bodyIdleTimeoutMs?: number;
  /** Open connections kept to the engine (keep-alive). Default 1024. */
  maxSockets?: number;
  /** Largest /generate body accepted, in bytes. Default (0 or absent): {@link defaultMaxResponseBytes}. */
  maxResponseBytes?: number;
  /** The bytes of answers buffered at once, shared with other clients (the pool's; see ResponseBudget). None: unbounded. */
  responseBudget?: ResponseBudget;
}

/** SGLang's pause modes for ours: `keep` is SGLang's `in_place` (requests frozen with their KV cache). */
const PAUSE_MODE: Partial<Record<PauseMode, string>> = { abort: 'abort', keep: 'in_place' };

/**
 * Talks to an SGLang server through its native API, token in and token out (followed: SGLang v0.5.6+ —
 * `python/sglang/srt/entrypoints/http_server.py`, `managers/io_struct.py`, `sampling/sampling_params.py`):
 *
 * - `POST /generate` `{input_ids, sampling_params: {max_new_tokens, temperature, top_p, top_k, sampling_seed,
 *   stop, stop_token_ids, skip_special_tokens: false}, return_logprob: true, logprob_start_len: -1, stream: false, rid}` — the
 *   sampled ids and logprobs come back in `meta_info.output_token_logprobs` (`[logprob, id, null]` per token) and
 *   `output_ids`, and are used exactly as returned;
 * - `GET /health_generate` (200 once the engine produced a token, 503 otherwise; `GET /get_model_info` while paused);
 * - `GET /v1/models` for `max_model_len` (SGLang's context_len; `/get_model_info` does not state it) and
 *   `GET /get_server_info` for the running-request cap (the backend's capacity when none is configured) and the
 *   token pool (`max_total_num_tokens`), which bounds a request too when it is below context_len (see modelInfo);
 * - `POST /abort_request` `{rid}` or `{abort_all: true}`; `POST /pause_generation` `{mode: 'abort'|'in_place'}`
 *   and `POST /continue_generation` (SGLang has no "wait" mode: the pool drains its own requests first).
 *
 * Every answer passes the same checks as vLLM's ({@link checkSglangGenerate}: ids in the vocabulary, at most
 * max_tokens, one finite logprob <= tolerance per token; bodies bounded in bytes by the shared {@link EngineHttp}).
 * Its logprobs are log(softmax(logits / temperature)): after temperature, before top-p/top-k/min-p (before temperature
 * too when the engine runs with SGLANG_RETURN_ORIGINAL_LOGPROB=1). No answer says which, so the backend's logprobs
 * mode is unknown unless declared (see parseSglangServerInfo).
 * SGLang's context-length 400 becomes a {@link ContextOverflowError}. Its limit is strict (prompt + max_new_tokens
 * must stay below context_len), so this client reports `context_len - 1` as maxModelLen — the largest
 * prompt + max_tokens it accepts — keeping vLLM's meaning for the rest of the server.
 *
 * @example
 * const client = new SglangClient({ url: 'http://127.0.0.1:30000', model: 'Qwen/Qwen3-8B' });
 * const out = await client.generate({ promptIds, maxTokens: 1024, temperature: 1, requestId: 'traj-7-3', signal });
 */
export class SglangClient implements EngineClient {
  readonly kind = 'sglang' as const;
  readonly url: string;
  readonly model: string;
  readonly #maxResponseBytes: number;
  readonly #responseBudget: ResponseBudget | undefined;
  readonly #http: EngineHttp;
  /** The largest prompt + max_tokens its token pool takes (max_total_num_tokens - 1), once GET /get_server_info said. */
  #tokenPoolLimit: number | undefined;
  /**
   * SGLang's /generate answer: its context-length refusal (context-overflow.ts), whose limit is at most the token
   * pool's (the tokenizer manager checks context_len only), and checkSglangGenerate.
   */
  readonly #answer: GenerateAnswerKind = {
    engine: 'SGLang',
    noun: 'answer',
    overflow: (status, text) => {
      const overflow = parseSglangContextOverflow(status, text);
      const pool = this.#tokenPoolLimit;
      return overflow === undefined || pool === undefined ? overflow : { ...overflow, maxModelLen: Math.min(overflow.maxModelLen, pool) };
    },
    check: checkSglangGenerate,
  };

  constructor(options: SglangClientOptions) {
    this.#http = new EngineHttp({
      url: options.url,
      label: 'SGLang',
      requestTimeoutMs: options.requestTimeoutMs ?? 0,
      ...(options.bodyIdleTimeoutMs !== undefined && { bodyIdleTimeoutMs: options.bodyIdleTimeoutMs }),
      maxSockets: options.maxSockets ?? 1024,
    });
    this.url = this.#http.url;
    this.model = options.model;
    this.#maxResponseBytes = options.maxResponseBytes ?? 0;
    this.#responseBudget = options.responseBudget;
  }

  close(): void {
    this.#http.close();
  }

  async generate(request: GenerateRequest): Promise<GenerateResult> {
    // Every sampling field is sent, unset ones neutral (see NEUTRAL_SAMPLING: SGLang would take the model's defaults).
    const sampling: Record<string, unknown> = {
      max_new_tokens: request.maxTokens,
      skip_special_tokens: false,
      temperature: request.temperature ?? NEUTRAL_SAMPLING.temperature,
      top_p: request.topP ?? NEUTRAL_SAMPLING.topP,
      top_k: request.topK ?? NEUTRAL_SAMPLING.topK,
      min_p: NEUTRAL_SAMPLING.minP,
      repetition_penalty: NEUTRAL_SAMPLING.repetitionPenalty,
      presence_penalty: NEUTRAL_SAMPLING.presencePenalty,
      frequency_penalty: NEUTRAL_SAMPLING.frequencyPenalty,
    };
    if (request.seed !== undefined) sampling.sampling_seed = request.seed;
    if (request.stop !== undefined && request.stop.length > 0) sampling.stop = request.stop;
    if (request.stopTokenIds !== undefined && request.stopTokenIds.length > 0) sampling.stop_token_ids = request.stopTokenIds;
    // The ids are written from the ledger's serialized context (prompt-json.ts), not serialized again.
    const body: Record<string, unknown> = {
      sampling_params: sampling,
      return_logprob: true,
      logprob_start_len: -1,
      stream: false,
    };
    if (request.requestId !== undefined) {
      checkRequestId(request.requestId);
      body.rid = request.requestId;
    }

    const cap = this.#maxResponseBytes > 0 ? this.#maxResponseBytes : defaultMaxResponseBytes(request.promptIds.length, request.maxTokens);
    return this.#http.exchange('POST', '/generate', bodyWithIds('input_ids', request.promptIds, body), request.signal, cap, { pausedMs: request.pausedMs, budget: this.#responseBudget }, (answer) => readGenerateAnswer(this.#answer, this.url, answer, request));
  }

  /**
   * GET /health_generate: 200 when the engine can generate (it runs a one-token request when idle). SGLang's health
   * check is a generate request: while the engine is paused it waits at the pause like any other (and answers 503
   * after SGLang's 20 s), so a paused engine (`options.paused`) is asked GET /get_model_info instead — the server
   * answers, which is all a probe can learn until the resume. (Probing /health_generate there marked every engine
   * unhealthy during any weight sync longer than two probes, and the pool-wide resume then waited for a probe that
   * could not pass: the engines stayed paused for good.)
   */
  async health(signal: AbortSignal, options: HealthOptions = {}): Promise<boolean> {
    return probeHealth(this.#http, options.paused === true ? '/get_model_info' : '/health_generate', signal);
  }

  /**
   * GET /v1/models: the card of this client's model, or the only card (SGLang's /generate takes no model name, so an
   * engine serving one model under another name still serves this client); its max_model_len is context_len. And GET
   * /get_server_info: its token pool (max_total_num_tokens, see {@link parseSglangTokenPool}), which SGLang's
   * scheduler also caps every request at: the limit is the smaller of the two. An engine whose server info does not
   * say (an error status, no such field) is limited by its context length alone.
   */
  async modelInfo(signal: AbortSignal): Promise<EngineModelInfo> {
    const [len, pool] = await Promise.all([modelCardMaxLen(this.#http, `SGLang ${this.url}`, this.model, signal), this.#tokenPool(signal)]);
    // SGLang refuses prompt + max_new_tokens >= its context length (vLLM only when >): one less keeps vLLM's meaning.
    this.#tokenPoolLimit = pool !== undefined && pool > 1 ? pool - 1 : undefined;
    const limits = [len, pool].filter((n): n is number => n !== undefined && n > 1);
    return limits.length > 0 ? { maxModelLen: Math.min(...limits) - 1 } : {};
  }

  /** GET /get_server_info's token pool; undefined when the engine does not say (throws only when unreachable). */
  async #tokenPool(signal: AbortSignal): Promise<number | undefined> {
    const { status, text } = await this.#http.request('GET', '/get_server_info', undefined, signal, MAX_INFO_BODY_BYTES);
    if (status < 200 || status >= 300) return undefined;
    try {
      return parseSglangTokenPool(JSON.parse(text));
    } catch {
      return undefined;
    }
  }

  /**
   * GET /get_server_info: the engine's capacity (its running-request cap per data-parallel rank, summed). Its
   * logprobs mode is not in the answer (an environment variable decides it), see {@link parseSglangServerInfo}.
   */
  async serverInfo(signal: AbortSignal): Promise<EngineServerInfo> {
    return fetchServerInfo(this.#http, '/get_server_info', signal, parseSglangServerInfo);
  }

  /**
   * GET /metrics (served with --enable-metrics): tokens prefilled plus tokens generated (see engine-progress.ts), for
   * the pool's stall watchdog. (Its health check, /health_generate, generates too, so the prober already finds an
   * SGLang whose scheduler hung; this covers one whose probes still get through.)
   */
  async progress(signal: AbortSignal): Promise<number | undefined> {
    return fetchProgress(this.#http, SGLANG_PROGRESS_COUNTERS, signal);
  }

  /** POST /abort_request once per id (`{rid}`), or `{abort_all: true}` without ids. */
  async abort(requestIds: readonly string[] | undefined, signal: AbortSignal): Promise<void> {
    if (requestIds === undefined) return this.#http.control('/abort_request', { abort_all: true }, signal);
    for (const id of requestIds) checkRequestId(id);
    await Promise.all(requestIds.map((rid) => this.#http.control('/abort_request', { rid }, signal)));
  }

  /** POST /pause_generation {mode}: `abort` and `keep` (SGLang's in_place); `wait` is refused (field mode). */
  async pause(mode: PauseMode, signal: AbortSignal): Promise<void> {
    const sglangMode = PAUSE_MODE[mode];
    if (sglangMode === undefined) throw RolloutError.invalid('mode', `SGLang has no "${String(mode)}" pause mode (it has abort and keep)`);
    await this.#http.control('/pause_generation', { mode: sglangMode }, signal);
  }

  /** POST /continue_generation. */
  async resume(signal: AbortSignal): Promise<void> {
    await this.#http.control('/continue_generation', {}, signal);
  }
}
