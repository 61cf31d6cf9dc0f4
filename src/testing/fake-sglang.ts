import { randomUUID } from 'node:crypto';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Tokenizer } from '../tokens/types.js';
import { hashInts } from './arithmetic.js';
import { closeServer, listenLocal, OK_JSON, readJson, streamOversized } from './fake-http.js';
import { FakeInflight } from './fake-inflight.js';
import { abortedSample, FakeSampler, type FakeSample } from './fake-sampling.js';
import type { InjectedFailure } from './fake-vllm.js';
import type { FakePolicy } from './scripted-policy.js';

/** Behaviour of a FakeSglangEngine (the same knobs as the fake vLLM). */
export interface FakeSglangOptions {
  tokenizer: Tokenizer;
  /** Served model name, listed by GET /v1/models (SGLang's /generate takes no model). */
  model?: string;
  /** Simulated decode time per token, in ms; requests stay in flight long enough to be paused or aborted. */
  tokenLatencyMs?: number;
  policy?: FakePolicy;
  tokenize?: (text: string) => number[];
  /**
   * Called for every /generate request (after `failNext` faults); a `tamper` fault receives the whole answer
   * object (`{text, output_ids, meta_info}`).
   */
  inject?: (request: { index: number; body: Record<string, unknown> }) => InjectedFailure | undefined;
  /** SGLang's context_len (default 40960): prompt + max_new_tokens >= it is refused, as SGLang does. */
  contextLength?: number;
  /**
   * The tokens its KV pool holds (`max_total_num_tokens` in GET /get_server_info and each rank's
   * `memory_usage.token_capacity`; default 4 × contextLength). Below contextLength it is the real limit, as in SGLang
   * v0.5.6's scheduler: max_req_len = min(context_len - 1, max_total_num_tokens - 1); a prompt of max_req_len - 5 tokens
   * or more is refused, and max_new_tokens is cut to max_req_len - prompt - 1 (the answer ends "length" there).
   */
  maxTotalNumTokens?: number;
  /**
   * The running-request cap of each data-parallel rank, as GET /get_server_info reports it
   * (`internal_states[*].effective_max_running_requests_per_dp`; default 256). Only reported: the fake runs any
   * number at once.
   */
  maxRunningRequests?: number;
  /** Data-parallel ranks (`dp_size`, one internal state each; default 1). */
  dpSize?: number;
  /**
   * How many of the prompt's last ids `output_ids` starts with before the sampled ones (default 0): SGLang's
   * detokenizer sends its decode ids there, which can include up to 5 "surrounding" prompt tokens
   * (sgl-project/sglang#10896, #17240); `meta_info.output_token_logprobs` holds the sampled ones only.
   */
  surroundingIds?: number;
  /** How long /health and /health_generate take to answer (default 0; SGLang's take at least 1 s: they poll every second). */
  healthDelayMs?: number;
  /** Sees every answer the engine returns. */
  onCompletion?: (completion: { promptIds: readonly number[]; tokenIds: readonly number[]; logprobs: readonly number[]; finishReason: FakeSample['finish'] }) => void;
}

/** Counters a test reads. */
export interface FakeSglangStats {
  received: number;
  served: number;
  failed: number;
  aborted: number;
  healthChecks: number;
  oversizedBytesSent: number;
}

/** SGLang's finish_reason object for a sample (schedule_batch.py's FINISH_* to_json shapes). */
function finishReason(sample: FakeSample, stopId: number): Record<string, unknown> {
  if (sample.finish === 'length') return { type: 'length', length: sample.ids.length };
  if (sample.finish === 'abort') return { type: 'abort', message: 'Abort in running batch.', status_code: null, err_type: null };
  return { type: 'stop', matched: sample.stopTokenId ?? sample.stopReason ?? stopId };
}

/**
 * TEST DOUBLE: a real HTTP server on 127.0.0.1 speaking the subset of SGLang's native API the rollout server uses,
 * shaped after SGLang v0.5.6+ (entrypoints/http_server.py, managers/io_struct.py, sampling/sampling_params.py):
 *
 * - `POST /generate` `{input_ids, sampling_params: {max_new_tokens, temperature, top_p, top_k, sampling_seed, stop,
 *   ...}, return_logprob, logprob_start_len, rid, stream: false}` → `{text, output_ids, meta_info: {id,
 *   finish_reason: {type, matched|length|message}, prompt_tokens, completion_tokens, cached_tokens,
 *   output_token_logprobs: [[logprob, id, null], ...] (with return_logprob)}}`, a request aborted before its first
 *   token answering as one aborted in SGLang's waiting queue (`{text: '', meta_info: {finish_reason: {type: 'abort',
 *   message: 'Abort before prefill'}, prompt_tokens: 0, completion_tokens: 0}}`); errors are HTTP 400
 *   `{"error": {"message"}}`, the context-length ones with SGLang's wording;
 * - `GET /health`, `GET /health_generate` (200, or 503 when unhealthy; held while paused, as SGLang's generate-based
 *   check is), `GET /get_model_info`, `GET /v1/models`
 *   (`max_model_len` = context_len), `GET /get_server_info` (server args, `internal_states` with the running cap);
 * - `POST /abort_request {rid | abort_all}`, `POST /pause_generation {mode: abort|retract|in_place}`,
 *   `POST /continue_generation`.
 *
 * Sampling is the fake vLLM's (the same scripted policy, ids and logprobs for the same request), so trajectories
 * from either engine can be compared. Not for production use.
 */
export class FakeSglangEngine {
  readonly model: string;
  /** The last /generate body, as parsed JSON. */
  lastRequest: Record<string, unknown> | undefined;
  readonly #stats: FakeSglangStats = { received: 0, served: 0, failed: 0, aborted: 0, healthChecks: 0, oversizedBytesSent: 0 };
  readonly #faults: InjectedFailure[] = [];
  readonly #sampler: FakeSampler;
  readonly #inflight = new FakeInflight();
  #healthy = true;
  #server: Server | undefined;
  #url = '';

  private constructor(private readonly options: FakeSglangOptions) {
    this.model = options.model ?? 'fake-qwen3';
    this.#sampler = new FakeSampler(options);
  }

  static async start(options: FakeSglangOptions): Promise<FakeSglangEngine> {
    const engine = new FakeSglangEngine(options);
    const { server, url } = await listenLocal((req, res) => void engine.#route(req, res));
    engine.#server = server;
    engine.#url = url;
    return engine;
  }

  get url(): string {
    return this.#url;
  }

  get paused(): boolean {
    return this.#inflight.paused;
  }

  /** The rids of the requests decoding now. */
  inflightRequestIds(): string[] {
    return this.#inflight.ids();
  }

  stats(): FakeSglangStats {
    return { ...this.#stats, aborted: this.#inflight.abortedCount };
  }

  failNext(count: number, failure: InjectedFailure = { kind: 'status', status: 500 }): void {
    for (let i = 0; i < count; i++) this.#faults.push(failure);
  }

  setHealthy(healthy: boolean): void {
    this.#healthy = healthy;
  }

  async close(): Promise<void> {
    this.#inflight.resume();
    if (this.#server) await closeServer(this.#server);
  }

  async #route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0];
    const post = req.method === 'POST' || req.method === 'PUT';
    if (req.method === 'GET' && (path === '/health' || path === '/health_generate')) {
      this.#stats.healthChecks++;
      // SGLang's health check is a one-token generate request: while paused it waits at the pause like any other.
      await this.#inflight.admit();
      const delay = this.options.healthDelayMs ?? 0;
      if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay));
      res.writeHead(this.#healthy ? 200 : 503).end();
    } else if (req.method === 'GET' && path === '/get_model_info') {
      sendJson(res, 200, { model_path: this.model, tokenizer_path: this.model, is_generation: true, preferred_sampling_params: null, weight_version: 'default' });
    } else if (req.method === 'GET' && path === '/v1/models') {
      const card = { id: this.model, object: 'model', created: Math.floor(Date.now() / 1000), owned_by: 'sglang', root: this.model, parent: null,
        max_model_len: this.#contextLength };
      sendJson(res, 200, { object: 'list', data: [card] });
    } else if (req.method === 'GET' && path === '/get_server_info') {
      sendJson(res, 200, this.#serverInfo());
    } else if (post && path === '/generate') {
      await this.#generate(req, res);
    } else if (req.method === 'POST' && path === '/abort_request') {
      const body = (await readJson(req).catch(() => undefined)) as { rid?: unknown; abort_all?: unknown } | undefined;
      if (body?.abort_all === true) this.#inflight.abort();
      else if (typeof body?.rid === 'string') this.#inflight.abort([body.rid]);
      res.writeHead(200).end();
    } else if (req.method === 'POST' && path === '/pause_generation') {
      const body = (await readJson(req).catch(() => undefined)) as { mode?: unknown } | undefined;
      const mode = body?.mode ?? 'abort';
      if (mode !== 'abort' && mode !== 'retract' && mode !== 'in_place') return sendError(res, 400, `Invalid mode: '${String(mode)}'. Expected one of ['abort', 'retract', 'in_place'].`);
      await this.#inflight.pause(mode === 'abort' ? 'abort' : 'keep');
      sendJson(res, 200, { message: 'Generation paused successfully.', status: 'ok' });
    } else if (req.method === 'POST' && path === '/continue_generation') {
      await readJson(req).catch(() => undefined);
      this.#inflight.resume();
      sendJson(res, 200, { message: 'Generation continued successfully.', status: 'ok' });
    } else {
      sendJson(res, 404, { detail: 'Not Found' });
    }
  }

  /**
   * SGLang's GET /get_server_info: the server arguments flattened at the top level (a few of them here; the flag
   * --max-running-requests is null when not given), the scheduler's info, one internal state per DP rank, version.
   */
  #serverInfo(): Record<string, unknown> {
    const dp = this.options.dpSize ?? 1;
    const perRank = this.options.maxRunningRequests ?? 256;
    const tokens = this.#maxTotalNumTokens;
    const state = { last_gen_throughput: 0, memory_usage: { weight: 1, kvcache: 0.2, token_capacity: tokens, graph: 0 }, effective_max_running_requests_per_dp: perRank };
    return {
      model_path: this.model, served_model_name: this.model, context_length: this.#contextLength, dp_size: dp, tp_size: 1,
      max_running_requests: null, sampling_backend: 'pytorch', max_total_num_tokens: tokens, max_req_input_len: this.#maxReqLen - 5,
      internal_states: Array.from({ length: dp }, () => ({ ...state })), version: '0.5.6-fake',
    };
  }

  get #contextLength(): number {
    return this.options.contextLength ?? 40960;
  }

  get #maxTotalNumTokens(): number {
    return this.options.maxTotalNumTokens ?? 4 * this.#contextLength;
  }

  /** The scheduler's max_req_len (see FakeSglangOptions.maxTotalNumTokens). */
  get #maxReqLen(): number {
    return Math.min(this.#contextLength - 1, this.#maxTotalNumTokens - 1);
  }

  async #generate(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const stats = this.#stats;
    const index = stats.received++;
    let body: Record<string, unknown>;
    try {
      body = (await readJson(req)) as Record<string, unknown>;
      if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new Error('not an object');
    } catch {
      stats.failed++;
      return sendError(res, 400, 'request body is not a JSON object');
    }
    this.lastRequest = body;
    const fault = this.#faults.shift() ?? this.options.inject?.({ index, body });
    if (fault !== undefined && fault.kind !== 'tamper') {
      stats.failed++;
      if (fault.kind === 'drop') return void req.socket.destroy();
      if (fault.kind === 'hang') return;
      if (fault.kind === 'oversized') return streamOversized(res, fault.bytes, '{"text":"', (n) => (stats.oversizedBytesSent += n));
      if (fault.kind === 'garbage') return void res.writeHead(200, OK_JSON).end(fault.body);
      if (fault.kind === 'slowDrop') {
        res.writeHead(200, OK_JSON).write(fault.partial);
        const timer = setTimeout(() => req.socket.destroy(), fault.afterMs);
        return void res.on('close', () => clearTimeout(timer));
      }
      return sendError(res, fault.status, fault.message ?? 'injected failure', fault.headers);
    }
    const sampling = (body.sampling_params ?? {}) as Record<string, unknown>;
    const promptIds = body.input_ids;
    if (!Array.isArray(promptIds) || promptIds.length === 0 || !promptIds.every((x) => Number.isInteger(x) && x >= 0)) {
      stats.failed++;
      return sendError(res, 400, 'FakeSglangEngine accepts only a non-empty flat list of input_ids');
    }
    if (body.stream === true) {
      stats.failed++;
      return sendError(res, 400, 'streaming is not faked');
    }
    const maxNew = sampling.max_new_tokens ?? 128;
    if (!Number.isInteger(maxNew) || (maxNew as number) < 0) {
      stats.failed++;
      return sendError(res, 400, `max_new_tokens must be at least 0, got ${String(maxNew)}.`);
    }
    // SGLang's own wording (tokenizer_manager's request validation), refused with >=, not vLLM's >.
    const context = this.#contextLength;
    if (promptIds.length >= context) {
      stats.failed++;
      return sendError(res, 400, `The input (${promptIds.length} tokens) is longer than the model's context length (${context} tokens).`);
    }
    if (promptIds.length + (maxNew as number) >= context) {
      stats.failed++;
      return sendError(res, 400, `Requested token count exceeds the model's maximum context length of ${context} tokens. You requested a total of ` +
        `${promptIds.length + (maxNew as number)} tokens: ${promptIds.length} tokens from the input messages and ${String(maxNew)} tokens for the ` +
        'completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.');
    }
    // The scheduler's checks (validate_input_length, then max_new_tokens cut to the room its token pool leaves).
    const maxReqInputLen = this.#maxReqLen - 5;
    if (promptIds.length >= maxReqInputLen) {
      stats.failed++;
      return sendError(res, 400, `Input length (${promptIds.length} tokens) exceeds the maximum allowed length (${maxReqInputLen} tokens). Use a shorter input or enable --allow-auto-truncate.`);
    }
    const maxNewTokens = Math.min(maxNew as number, this.#maxReqLen - promptIds.length - 1);
    await this.#inflight.admit();
    const rid = typeof body.rid === 'string' ? body.rid : randomUUID().replaceAll('-', '');
    const seed = typeof sampling.sampling_seed === 'number' ? sampling.sampling_seed : hashInts(index, 0x5eed);
    const stops = Array.isArray(sampling.stop) ? (sampling.stop as string[]) : typeof sampling.stop === 'string' ? [sampling.stop] : [];
    const stopTokenIds = Array.isArray(sampling.stop_token_ids) ? (sampling.stop_token_ids as number[]) : [];
    let sample = lengthBeforeStop(this.#sampler.sample(promptIds as number[], maxNewTokens, seed, stops, stopTokenIds), maxNewTokens);
    let answered = false;
    res.on('close', () => {
      if (!answered) this.#inflight.cancel(rid);
    });
    const outcome = await this.#inflight.run(rid, sample.ids.length, this.options.tokenLatencyMs ?? 0);
    if (res.destroyed) return;
    answered = true;
    stats.served++;
    if (outcome.aborted) sample = abortedSample(sample, outcome.produced);
    this.options.onCompletion?.({ promptIds: promptIds as number[], tokenIds: sample.ids, logprobs: sample.logprobs, finishReason: sample.finish });
    const answer = outcome.aborted && sample.ids.length === 0
      ? { text: '', meta_info: { id: rid, finish_reason: { type: 'abort', message: 'Abort before prefill', status_code: null, err_type: null }, prompt_tokens: 0, completion_tokens: 0 } }
      : this.#render(body, sampling, rid, promptIds as number[], sample);
    if (fault?.kind === 'tamper') fault.tamper(answer, answer);
    sendJson(res, 200, answer);
  }

  /** The non-streaming /generate answer for one prompt. */
  #render(body: Record<string, unknown>, sampling: Record<string, unknown>, rid: string, promptIds: readonly number[], sample: FakeSample): Record<string, unknown> {
    const { tokenizer } = this.options;
    // SGLang trims a matched stop token or string from the text unless no_stop_trim; special tokens are skipped
    // unless skip_special_tokens is false.
    const trimmed = sample.finish === 'stop' && sample.stopReason === null && sampling.no_stop_trim !== true ? sample.ids.slice(0, -1) : sample.ids;
    const decoded = tokenizer.decode(trimmed, { skipSpecialTokens: sampling.skip_special_tokens !== false });
    // A matched stop string is cut from the text (its tokens stay in the ids) unless no_stop_trim.
    const stop = sample.stopReason;
    const text = stop !== null && sampling.no_stop_trim !== true && decoded.includes(stop) ? decoded.slice(0, decoded.indexOf(stop)) : decoded;
    const meta: Record<string, unknown> = {
      id: rid,
      finish_reason: finishReason(sample, this.#sampler.stopId),
      prompt_tokens: promptIds.length,
      weight_version: 'default',
      completion_tokens: sample.ids.length,
      cached_tokens: 0,
      e2e_latency: 0.01,
    };
    if (body.return_logprob === true) {
      const withText = body.return_text_in_logprobs === true;
      meta.input_token_logprobs = [];
      meta.output_token_logprobs = sample.ids.map((id, i) => [sample.logprobs[i], id, withText ? tokenizer.decode([id]) : null]);
    }
    const surrounding = Math.min(this.options.surroundingIds ?? 0, promptIds.length);
    return { text, output_ids: [...promptIds.slice(promptIds.length - surrounding), ...sample.ids], meta_info: meta };
  }
}

/**
 * SGLang's Req.check_finished tests the length cap before stop tokens (`stop_token_ids`, EOS) and stop strings, so an
 * answer whose stop comes on its max_new_tokens-th token ends `{type: 'length', length: max_new_tokens}`, the stop
 * token kept as its last id and nothing trimmed from its text (schedule_batch.py, SGLang v0.4.x to v0.5.x and main).
 */
function lengthBeforeStop(sample: FakeSample, maxNewTokens: number): FakeSample {
  if (sample.finish !== 'stop' || sample.ids.length < maxNewTokens) return sample;
  return { ids: sample.ids, logprobs: sample.logprobs, finish: 'length', stopReason: null };
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, OK_JSON).end(JSON.stringify(body));
}

/** SGLang's _create_error_response shape: `{"error": {"message": ...}}`. */
function sendError(res: ServerResponse, status: number, message: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, { ...OK_JSON, ...headers }).end(JSON.stringify({ error: { message } }));
}
