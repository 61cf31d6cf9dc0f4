import { RolloutError } from '../errors.js';
import { checkAnswerId, checkCompletion, isRecord } from './completion.js';
import { bodyWithIds } from './prompt-json.js';
import { parseContextOverflow } from './context-overflow.js';
import { readGenerateAnswer, type GenerateAnswerKind } from './generate-answer.js';
import { checkRequestId, EngineHttp, EngineHttpError, modelCardMaxLen, probeHealth } from './engine-http.js';
import type { ResponseBudget } from './response-budget.js';
import { fetchServerInfo, parseVllmServerInfo } from './server-info.js';
import { fetchProgress, VLLM_PROGRESS_COUNTERS } from './engine-progress.js';
import { NEUTRAL_SAMPLING, type EngineClient, type EngineModelInfo, type EngineServerInfo, type GenerateRequest, type GenerateResult, type PauseMode } from './types.js';

export { MAX_ERROR_BODY_BYTES } from './engine-http.js';

/** Where a vLLM server is and how long one request may take. */
export interface VllmClientOptions {
  /** Base URL of the server, without `/v1` (e.g. `http://gpu-node-3:8000`). */
  url: string;
  /** Served model name, sent as `model` (vLLM's `--served-model-name`). */
  model: string;
  /** Budget of one completion request; past it the request is aborted and fails with backend_error. 0 = none. */
  requestTimeoutMs?: number;
  /** How long an answer's body may stall after its headers (see EngineHttpOptions.bodyIdleTimeoutMs). Default 30 s. */
  bodyIdleTimeoutMs?: number;
  /** Open connections kept to the engine (keep-alive); requests beyond wait for one. Default 1024. */
  maxSockets?: number;
  /**
   * Largest completion body accepted, in bytes; a bigger answer fails with backend_error as soon as the cap is
   * passed (the connection is destroyed, the rest never read). Default (0 or absent): per request,
   * {@link defaultMaxResponseBytes} of its prompt length and max_tokens.
   */
  maxResponseBytes?: number;
  /** The bytes of answers buffered at once, shared with other clients (the pool's; see ResponseBudget). None: unbounded. */
  responseBudget?: ResponseBudget;
  /**
   * Refuse a completion whose `id` is not `cmpl-<the request's X-Request-Id>` (default false). vLLM names a completion
   * after the X-Request-Id header it was sent with, so another id is an answer to another request — even one whose
   * prompt has the same length, which the always-on `usage.prompt_tokens` check cannot tell apart (the samples of a
   * GRPO group share their prompt). Opt-in because only vLLM itself is known to keep that id: a gateway or proxy in
   * front of it (or another OpenAI-style server) may name answers its own way, and every answer would be refused.
   */
  checkAnswerId?: boolean;
}

/**
 * The default cap on a completion body: 64 KiB of envelope, 1 KiB per requested token (a token appears in
 * `token_ids`, `token_logprobs`, `tokens`, `top_logprobs`, `text_offset` and `text`; ~50 bytes typically, a few
 * hundred when its text is JSON-escaped) and 16 bytes per prompt token (room for `prompt_token_ids`, which vLLM echoes
 * when asked for `return_token_ids`; this client no longer asks, but the cap stays safe for answers that carry it). Generous
 * for any honest answer, and still far below the ~512 MiB at which Node cannot even hold the body as a string.
 */
export function defaultMaxResponseBytes(promptTokens: number, maxTokens: number): number {
  return 64 * 1024 + 1024 * maxTokens + 16 * promptTokens;
}

/** A non-2xx answer from vLLM (the shared {@link EngineHttpError}; the name is kept for existing callers). */
export const VllmHttpError = EngineHttpError;
export type VllmHttpError = EngineHttpError;

/** vLLM's /v1/completions answer: its context-length refusals (context-overflow.ts) and checkCompletion. */
const VLLM_ANSWER: GenerateAnswerKind = {
  engine: 'vLLM',
  noun: 'completion',
  overflow: (status, text, r) => parseContextOverflow(status, text, r.maxTokens > 0 ? r.promptIds.length : undefined),
  check: checkCompletion,
};

/**
 * The same, and the answer names the request (VllmClientOptions.checkAnswerId): vLLM's completion id is
 * `cmpl-<X-Request-Id>` (serving_completion.py, `_base_request_id`). Checked before anything else is read of it; an
 * answer without an id, or a request sent without one, is not checked.
 */
const VLLM_ANSWER_NAMED: GenerateAnswerKind = {
  ...VLLM_ANSWER,
  check: (json, expect) => {
    if (expect.requestId !== undefined && isRecord(json)) checkAnswerId({ ...expect, requestId: `cmpl-${expect.requestId}` }, json.id, 'id', 'completion id (cmpl-<X-Request-Id>)');
    return checkCompletion(json, expect);
  },
};

/**
 * Talks to a vLLM OpenAI-compatible server through `/v1/completions` with a token-id prompt ("token in, token
 * out"): the prompt goes as a list of ids, `logprobs: 0` brings back the logprob of each sampled token only
 * (`choices[0].logprobs.token_logprobs`) and `return_tokens_as_token_ids: true` names each sampled token by its id
 * (`choices[0].logprobs.tokens`, `"token_id:<id>"`). Not `return_token_ids`: vLLM would echo the whole prompt's ids
 * with it, whose JSON (400 KB at 64K tokens) cost the event loop more than a millisecond per turn to parse. Both are used exactly as returned, never re-derived from text, so the
 * trainer sees the very tokens the policy sampled. `skip_special_tokens: false` keeps the stop token (e.g.
 * <|im_end|>) visible in the informational text.
 *
 * Every answer is checked where it enters, before it can become part of a trajectory: the body is bounded in bytes
 * (see {@link defaultMaxResponseBytes}; reading stops and the connection is dropped once the cap is passed, so no
 * engine answer can exhaust the server's memory), and {@link checkCompletion} checks ids (in the vocabulary, at
 * most max_tokens of them), logprobs (one per token, finite, <= 0 up to float noise), finish_reason and text.
 *
 * Errors: HTTP errors, timeouts, refused connections and refused answers become RolloutError('backend_error')
 * with the cause attached (an error body is kept, up to 64 KiB, as the cause's message); vLLM's context-length
 * 400 becomes a {@link ContextOverflowError} (truncation for the agent loop); an abort of the caller's signal keeps
 * its meaning (cancelled / deadline_exceeded).
 *
 * Request ids and control: a GenerateRequest.requestId travels as `request_id` and the X-Request-Id header (vLLM
 * then names the engine request `cmpl-<id>-0`); {@link abort}, {@link pause} and {@link resume} use the endpoints
 * a server started with VLLM_SERVER_DEV_MODE=1 serves (POST /abort_requests, /pause?mode=, /resume); without dev
 * mode they are 404s and fail with backend_error. The bounded HTTP reading is the shared {@link EngineHttp}.
 *
 * @example
 * const client = new VllmClient({ url: 'http://127.0.0.1:8000', model: 'Qwen/Qwen3-8B', requestTimeoutMs: 600_000 });
 * const out = await client.generate({ promptIds, maxTokens: 1024, temperature: 1, signal });
 */
export class VllmClient implements EngineClient {
  readonly kind = 'vllm' as const;
  readonly url: string;
  readonly model: string;
  readonly #maxResponseBytes: number;
  readonly #responseBudget: ResponseBudget | undefined;
  readonly #http: EngineHttp;
  readonly #answer: GenerateAnswerKind;

  constructor(options: VllmClientOptions) {
    this.#http = new EngineHttp({
      url: options.url,
      label: 'vLLM',
      requestTimeoutMs: options.requestTimeoutMs ?? 0,
      ...(options.bodyIdleTimeoutMs !== undefined && { bodyIdleTimeoutMs: options.bodyIdleTimeoutMs }),
      maxSockets: options.maxSockets ?? 1024,
    });
    this.url = this.#http.url;
    this.model = options.model;
    this.#maxResponseBytes = options.maxResponseBytes ?? 0;
    this.#responseBudget = options.responseBudget;
    this.#answer = options.checkAnswerId === true ? VLLM_ANSWER_NAMED : VLLM_ANSWER;
  }

  /** Closes idle keep-alive connections (when the backend is removed). */
  close(): void {
    this.#http.close();
  }

  async generate(request: GenerateRequest): Promise<GenerateResult> {
    // The prompt is written from the ledger's serialized context (prompt-json.ts), not serialized again.
    const body: Record<string, unknown> = {
      model: this.model,
      max_tokens: request.maxTokens,
      logprobs: 0,
      // The sampled ids as "token_id:<id>" tokens; return_token_ids would also echo every prompt id (see checkCompletion).
      return_tokens_as_token_ids: true,
      skip_special_tokens: false,
      stream: false,
    };
    // Every sampling field is sent, unset ones neutral (see NEUTRAL_SAMPLING: vLLM would take the model's defaults).
    body.temperature = request.temperature ?? NEUTRAL_SAMPLING.temperature;
    body.top_p = request.topP ?? NEUTRAL_SAMPLING.topP;
    body.top_k = request.topK ?? NEUTRAL_SAMPLING.topK;
    body.min_p = NEUTRAL_SAMPLING.minP;
    body.repetition_penalty = NEUTRAL_SAMPLING.repetitionPenalty;
    body.presence_penalty = NEUTRAL_SAMPLING.presencePenalty;
    body.frequency_penalty = NEUTRAL_SAMPLING.frequencyPenalty;
    if (request.seed !== undefined) body.seed = request.seed;
    if (request.stop !== undefined && request.stop.length > 0) body.stop = request.stop;
    if (request.stopTokenIds !== undefined && request.stopTokenIds.length > 0) body.stop_token_ids = request.stopTokenIds;
    const headers: Record<string, string> = {};
    if (request.requestId !== undefined) {
      checkRequestId(request.requestId);
      body.request_id = request.requestId;
      headers['x-request-id'] = request.requestId;
    }

    const cap = this.#maxResponseBytes > 0 ? this.#maxResponseBytes : defaultMaxResponseBytes(request.promptIds.length, request.maxTokens);
    return this.#http.exchange('POST', '/v1/completions', bodyWithIds('prompt', request.promptIds, body), request.signal, cap, { headers, pausedMs: request.pausedMs, budget: this.#responseBudget }, (answer) => readGenerateAnswer(this.#answer, this.url, answer, request));
  }

  /** GET /health: vLLM answers 200 with an empty body when the engine is alive, 503 when it is dead. */
  async health(signal: AbortSignal): Promise<boolean> {
    return probeHealth(this.#http, '/health', signal);
  }

  /**
   * GET /v1/models: vLLM lists the served model names with their `max_model_len`. Only the card whose id is exactly
   * this client's model counts: vLLM answers 404 to every completion naming a model it does not serve, so an engine
   * without that card is a {@link ModelNotServedError} (invalid_argument, field model), never another model's length.
   */
  async modelInfo(signal: AbortSignal): Promise<EngineModelInfo> {
    const len = await modelCardMaxLen(this.#http, `vLLM ${this.url}`, this.model, signal, { exact: true });
    return len !== undefined ? { maxModelLen: len } : {};
  }

  /**
   * GET /server_info?config_format=json (VLLM_SERVER_DEV_MODE=1): the engine's --logprobs-mode and its capacity
   * (max_num_seqs × data-parallel ranks), see {@link parseVllmServerInfo}. Without dev mode the route is a 404 and
   * nothing is learned. (vLLM 0.32 answers 500 when the route cannot list the Python packages: a uv venv without
   * `uv` on the server's PATH; src/testing/vllm-server.ts puts it there.)
   */
  async serverInfo(signal: AbortSignal): Promise<EngineServerInfo> {
    return fetchServerInfo(this.#http, '/server_info?config_format=json', signal, parseVllmServerInfo, 'not served: start vLLM with VLLM_SERVER_DEV_MODE=1');
  }

  /** GET /metrics: tokens prefilled plus tokens generated (see engine-progress.ts), for the pool's stall watchdog. */
  async progress(signal: AbortSignal): Promise<number | undefined> {
    return fetchProgress(this.#http, VLLM_PROGRESS_COUNTERS, signal);
  }

  /**
   * POST /abort_requests {request_ids} (VLLM_SERVER_DEV_MODE=1). vLLM names a completion's engine request
   * `cmpl-<request_id>-<prompt index>`, so the ids sent are `cmpl-<id>-0` for the one prompt this client sends;
   * no ids (an empty list) aborts everything in flight. Aborted requests answer with finish_reason "abort".
   */
  async abort(requestIds: readonly string[] | undefined, signal: AbortSignal): Promise<void> {
    for (const id of requestIds ?? []) checkRequestId(id);
    await this.#http.control('/abort_requests', { request_ids: (requestIds ?? []).map((id) => `cmpl-${id}-0`) }, signal);
  }

  /** POST /pause?mode=abort|wait|keep (VLLM_SERVER_DEV_MODE=1); vLLM has all three modes. */
  async pause(mode: PauseMode, signal: AbortSignal): Promise<void> {
    if (mode !== 'abort' && mode !== 'wait' && mode !== 'keep') throw RolloutError.invalid('mode', `unknown pause mode ${String(mode)}`);
    await this.#http.control(`/pause?mode=${mode}`, undefined, signal);
  }

  /** POST /resume (VLLM_SERVER_DEV_MODE=1). */
  async resume(signal: AbortSignal): Promise<void> {
    await this.#http.control('/resume', undefined, signal);
  }
}
