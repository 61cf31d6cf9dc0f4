import { randomUUID } from 'node:crypto';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { PauseMode } from '../backends/types.js';
import type { Tokenizer } from '../tokens/types.js';
import { hashInts } from './arithmetic.js';
import { FakeInflight } from './fake-inflight.js';
import { closeServer, listenLocal, OK_JSON, readJson, streamOversized } from './fake-http.js';
import { abortedSample, FakeSampler, type FakeSample } from './fake-sampling.js';
import type { FakePolicy } from './scripted-policy.js';
import type { VllmLogprobsMode } from './vllm-server.js';

/**
 * A fault to inject into one completion request: an HTTP error, a dropped connection, no answer at all, a
 * completion tampered with before it is sent (ids out of vocabulary, positive logprobs, more tokens than asked
 * for...), a 200 answer of `bytes` bytes streamed as the client reads them (generated on the fly, never held in
 * memory; it stops when the client goes away), a 200 answer whose body is `body` as given (not JSON, truncated
 * JSON, JSON of the wrong shape), or a 200 whose headers and first `partial` bytes are sent at once and whose
 * connection is then dropped after `afterMs` (an engine that answers slowly, then dies). A `status` fault's `headers`
 * are sent with it (e.g. `retry-after` on a 429 or 503).
 */
export type InjectedFailure =
  | { kind: 'status'; status: number; message?: string; headers?: Record<string, string> }
  | { kind: 'drop' }
  | { kind: 'hang' }
  | { kind: 'tamper'; tamper: Tamper }
  | { kind: 'oversized'; bytes: number }
  | { kind: 'garbage'; body: string }
  | { kind: 'slowDrop'; afterMs: number; partial: string };

/**
 * Changes an answer before it is sent. The fake vLLM engine passes `choices[0]` and the whole completion (its `usage`
 * counts the tokens sampled, whatever the tamper does to the choice, unless it changes `usage` too); the fake SGLang
 * engine passes its whole answer.
 */
export type Tamper = (choice: Record<string, unknown>, answer: Record<string, unknown>) => void;

/** Behaviour of a FakeVllmEngine: tokenizer, speed, policy and faults. */
export interface FakeVllmOptions {
  /** The canonical tokenizer: prompts are decoded and answers encoded with it, as a real engine would. */
  tokenizer: Tokenizer;
  /** Served model name (`--served-model-name`); requests naming another model get 404 like vLLM. */
  model?: string;
  /** Simulated decode time per generated token, in ms; 0 answers at once (benchmarks). */
  tokenLatencyMs?: number;
  /**
   * Simulated decode time of a whole completion, in ms, drawn per request (e.g. a long-tailed distribution for a
   * soak); when set it replaces `tokenLatencyMs` and is spread evenly over the sampled tokens, so a pause or abort
   * still cuts the answer where decoding was.
   */
  requestLatencyMs?: (request: { index: number; body: Record<string, unknown> }) => number;
  /** Produces the assistant text; defaults to `scriptedMathPolicy`. */
  policy?: FakePolicy;
  /** Called for every completion request (after `failNext` faults are used up); return a fault to inject it. */
  inject?: (request: { index: number; body: Record<string, unknown> }) => InjectedFailure | undefined;
  /**
   * Context length (default 40960), served as `max_model_len` by GET /v1/models; prompt + max_tokens beyond it is
   * vLLM's context-length 400.
   */
  maxModelLen?: number;
  /** False: GET /v1/models answers 404, so clients cannot learn the limit (default true; see `setModelsListed`). */
  listModels?: boolean;
  /**
   * Turns the policy's text into token ids (default: the canonical tokenizer). Tests pass a non-canonical
   * splitting to prove the server never re-tokenizes what the policy sampled.
   */
  tokenize?: (text: string) => number[];
  /**
   * True: the request's `stop_token_ids` are ignored, as by an engine (or a gateway in front of one) that drops the
   * field, so an answer goes on past a stop token the model's own end token is not (default false: honoured, as vLLM).
   */
  ignoreStopTokenIds?: boolean;
  /** Sees every completion the engine returns, so tests can compare trajectories with what was sampled. */
  onCompletion?: (completion: { promptIds: readonly number[]; tokenIds: readonly number[]; logprobs: readonly number[]; finishReason: 'stop' | 'length' | 'abort' }) => void;
  /**
   * VLLM_SERVER_DEV_MODE: when true (default), POST /pause?mode=, /resume, /abort_requests and GET /is_paused and
   * /server_info are served; when false they are 404s, as on a production vLLM.
   */
  devMode?: boolean;
  /**
   * The --logprobs-mode GET /server_info reports (default `processed_logprobs`, as the project's launch helper starts
   * vLLM; vLLM's own default is raw_logprobs). Only reported: the fake's logprobs are scripted either way.
   */
  logprobsMode?: VllmLogprobsMode;
  /** --max-num-seqs, as GET /server_info reports it (default 256). Only reported: the fake runs any number at once. */
  maxNumSeqs?: number;
}

/** Counters a test or benchmark reads to see what the engine was asked to do. */
export interface FakeVllmStats {
  /** Completion requests received (including faulted ones). */
  received: number;
  /** Completion requests answered with a completion. */
  served: number;
  /** Requests answered with a fault or an error status. */
  failed: number;
  /** Requests whose client went away before the answer. */
  disconnected: number;
  inflight: number;
  maxInflight: number;
  healthChecks: number;
  /** Bytes of `oversized` answers actually written to clients (a client that stops reading keeps this small). */
  oversizedBytesSent: number;
  /** Requests ended early by /abort_requests or a pause in abort mode (answered with finish_reason "abort"). */
  aborted: number;
}

/**
 * TEST DOUBLE: a real HTTP server on 127.0.0.1 that speaks the subset of vLLM's OpenAI-compatible API the
 * rollout server uses — `POST /v1/completions` with a token-id prompt, `logprobs`, `return_token_ids`, `return_tokens_as_token_ids`, `stop`,
 * `seed`, `request_id` (or the X-Request-Id header); `GET /health`; `GET /v1/models`; and the dev-mode routes
 * `GET /server_info` (its logprobs mode and max_num_seqs), `POST /pause?mode=abort|wait|keep`, `POST /resume`,
 * `POST /abort_requests {request_ids}` (engine ids
 * `cmpl-<request id>-0`, as vLLM names them) — with vLLM-shaped JSON. With `tokenLatencyMs` > 0 requests stay in
 * flight long enough to be paused or aborted; an aborted one answers with the tokens decoded so far and finish
 * "abort". A scripted policy writes the assistant text,
 * which is tokenized with the canonical tokenizer, closed with <|im_end|> (finish "stop") or cut at
 * `max_tokens` (finish "length"), and given deterministic negative logprobs. It lets the whole pipeline run
 * against the real wire protocol, with injectable faults, without a GPU. Not for production use.
 *
 * @example
 * const engine = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 0 });
 * const client = new VllmClient({ url: engine.url, model: engine.model });
 * // ...
 * await engine.close();
 */
export class FakeVllmEngine {
  readonly model: string;
  /** The last completion request body, as parsed JSON (for tests of the client's wire format). */
  lastRequest: Record<string, unknown> | undefined;
  /** The engine request id (`cmpl-<id>-0`) of the last completion request. */
  lastRequestId: string | undefined;
  readonly #stats: FakeVllmStats = { received: 0, served: 0, failed: 0, disconnected: 0, inflight: 0, maxInflight: 0, healthChecks: 0, oversizedBytesSent: 0, aborted: 0 };
  readonly #faults: InjectedFailure[] = [];
  readonly #sampler: FakeSampler;
  readonly #inflight = new FakeInflight();
  #healthy = true;
  #healthLatencyMs = 0;
  #listModels: boolean;
  #url = '';
  #server: Server | undefined;

  private constructor(private readonly options: FakeVllmOptions) {
    this.model = options.model ?? 'fake-qwen3';
    this.#listModels = options.listModels ?? true;
    this.#sampler = new FakeSampler(options);
  }

  /** Starts listening on 127.0.0.1 on a free port. */
  static async start(options: FakeVllmOptions): Promise<FakeVllmEngine> {
    const engine = new FakeVllmEngine(options);
    const { server, url } = await listenLocal((req, res) => void engine.#route(req, res));
    engine.#server = server;
    engine.#url = url;
    return engine;
  }

  /** Base URL, e.g. `http://127.0.0.1:40123` (no `/v1`). */
  get url(): string {
    return this.#url;
  }

  get requestsServed(): number {
    return this.#stats.served;
  }

  /** Whether a pause is in effect (until POST /resume). */
  get paused(): boolean {
    return this.#inflight.paused;
  }

  /** Engine ids (`cmpl-<request id>-0`) of the completions decoding now. */
  inflightRequestIds(): string[] {
    return this.#inflight.ids();
  }

  stats(): FakeVllmStats {
    return { ...this.#stats, aborted: this.#inflight.abortedCount };
  }

  /** The next `count` completion requests fail with `failure` (default: HTTP 500). */
  failNext(count: number, failure: InjectedFailure = { kind: 'status', status: 500 }): void {
    for (let i = 0; i < count; i++) this.#faults.push(failure);
  }

  /** What `/health` answers: 200 when healthy, 503 (vLLM's "engine dead") when not. */
  setHealthy(healthy: boolean): void {
    this.#healthy = healthy;
  }

  /** `/health` answers only after this many ms (an engine alive but slow to answer, or a congested link). */
  setHealthLatency(ms: number): void {
    this.#healthLatencyMs = ms;
  }

  /** Whether GET /v1/models answers (true) or is a 404 (false), e.g. to test learning the limit later. */
  setModelsListed(listed: boolean): void {
    this.#listModels = listed;
  }

  /** Stops the server and drops every open connection (hanging requests included). */
  async close(): Promise<void> {
    this.#inflight.resume();
    if (this.#server) await closeServer(this.#server);
  }

  async #route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const [path = '/', query = ''] = (req.url ?? '/').split('?');
    const dev = this.options.devMode ?? true;
    if (req.method === 'GET' && path === '/health') {
      this.#stats.healthChecks++;
      if (this.#healthLatencyMs > 0) await new Promise((resolve) => setTimeout(resolve, this.#healthLatencyMs));
      res.writeHead(this.#healthy ? 200 : 503).end();
    } else if (req.method === 'GET' && path === '/v1/models' && this.#listModels) {
      const card = { id: this.model, object: 'model', created: nowSeconds(), owned_by: 'vllm', root: this.model, parent: null,
        max_model_len: this.options.maxModelLen ?? 40960, permission: [] };
      res.writeHead(200, OK_JSON).end(JSON.stringify({ object: 'list', data: [card] }));
    } else if (req.method === 'POST' && path === '/v1/completions') {
      await this.#complete(req, res);
    } else if (dev && req.method === 'POST' && path === '/pause') {
      const mode = new URLSearchParams(query).get('mode') ?? 'abort';
      if (mode !== 'abort' && mode !== 'wait' && mode !== 'keep') return void res.writeHead(400, OK_JSON).end(JSON.stringify({ error: `invalid pause mode ${mode}` }));
      await this.#inflight.pause(mode satisfies PauseMode);
      res.writeHead(200, OK_JSON).end(JSON.stringify({ status: 'paused' }));
    } else if (dev && req.method === 'POST' && path === '/resume') {
      this.#inflight.resume();
      res.writeHead(200, OK_JSON).end(JSON.stringify({ status: 'resumed' }));
    } else if (dev && req.method === 'POST' && path === '/abort_requests') {
      const body = (await readJson(req).catch(() => null)) as { request_ids?: unknown } | null | undefined;
      if (typeof body !== 'object' || body === null) return sendError(res, 400, 'BadRequestError', 'Invalid JSON format');
      const ids = Array.isArray(body.request_ids) && body.request_ids.length > 0 ? body.request_ids.map(String) : undefined;
      const aborted = this.#inflight.abort(ids);
      res.writeHead(200, OK_JSON).end(JSON.stringify({ status: 'aborted', aborted: ids?.length ?? aborted }));
    } else if (dev && req.method === 'GET' && path === '/server_info') {
      res.writeHead(200, OK_JSON).end(JSON.stringify(this.#serverInfo(new URLSearchParams(query).get('config_format') === 'json')));
    } else if (dev && req.method === 'GET' && path === '/is_paused') {
      res.writeHead(200, OK_JSON).end(JSON.stringify({ is_paused: this.#inflight.paused }));
    } else {
      sendError(res, 404, 'NotFoundError', `no route ${req.method} ${path}`);
    }
  }

  /**
   * vLLM 0.32's GET /server_info, reduced to the parts of its shape that matter (recorded from the real one:
   * test/fixtures/vllm-0.32-server-info.json): `vllm_config` as JSON (config_format=json) or as the text of
   * str(VllmConfig) (the default, which does not carry logprobs_mode), `vllm_env` and `system_env`.
   */
  #serverInfo(json: boolean): Record<string, unknown> {
    const logprobsMode = this.options.logprobsMode ?? 'processed_logprobs';
    const maxModelLen = this.options.maxModelLen ?? 40960;
    const maxNumSeqs = this.options.maxNumSeqs ?? 256;
    const config = {
      model_config: { model: this.model, served_model_name: this.model, max_model_len: maxModelLen, logprobs_mode: logprobsMode, max_logprobs: 20, seed: 0 },
      cache_config: { block_size: 16, enable_prefix_caching: true, gpu_memory_utilization: 0.9 },
      parallel_config: { data_parallel_size: 1, data_parallel_size_local: 1, data_parallel_external_lb: false, data_parallel_hybrid_lb: false, tensor_parallel_size: 1 },
      scheduler_config: { max_num_seqs: maxNumSeqs, max_num_batched_tokens: 8192, max_model_len: maxModelLen },
    };
    const text = `model='${this.model}', max_seq_len=${maxModelLen}, seed=0, served_model_name=${this.model}, enable_prefix_caching=True`;
    return { vllm_config: json ? config : text, vllm_env: { VLLM_SERVER_DEV_MODE: true }, system_env: {} };
  }

  async #complete(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const stats = this.#stats;
    const index = stats.received++;
    let body: Record<string, unknown>;
    try {
      body = (await readJson(req)) as Record<string, unknown>;
      if (typeof body !== 'object' || body === null) throw new Error('not an object');
    } catch {
      stats.failed++;
      return sendError(res, 400, 'BadRequestError', 'request body is not JSON');
    }
    this.lastRequest = body;
    const header = req.headers['x-request-id'];
    const external = typeof header === 'string' ? header : typeof body.request_id === 'string' ? body.request_id : randomUUID();
    const requestId = `cmpl-${external}-0`;
    this.lastRequestId = requestId;
    const fault = this.#faults.shift() ?? this.options.inject?.({ index, body });
    if (fault !== undefined && fault.kind !== 'tamper') {
      stats.failed++;
      if (fault.kind === 'drop') return void req.socket.destroy();
      if (fault.kind === 'hang') return;
      if (fault.kind === 'oversized') {
        return streamOversized(res, fault.bytes, '{"id":"cmpl-oversized","object":"text_completion","choices":[{"text":"', (n) => (stats.oversizedBytesSent += n));
      }
      if (fault.kind === 'garbage') return void res.writeHead(200, OK_JSON).end(fault.body);
      if (fault.kind === 'slowDrop') {
        res.writeHead(200, OK_JSON).write(fault.partial);
        const timer = setTimeout(() => req.socket.destroy(), fault.afterMs);
        return void res.on('close', () => clearTimeout(timer));
      }
      return sendError(res, fault.status, 'InternalServerError', fault.message ?? 'injected failure', fault.headers);
    }
    const invalid = this.#validate(body);
    if (invalid !== undefined) {
      stats.failed++;
      return sendError(res, invalid.status, invalid.status === 404 ? 'NotFoundError' : 'BadRequestError', invalid.message);
    }
    await this.#inflight.admit();
    const promptIds = body.prompt as number[];
    const seed = typeof body.seed === 'number' ? body.seed : hashInts(index, 0x5eed);
    const stops = Array.isArray(body.stop) ? (body.stop as string[]) : typeof body.stop === 'string' ? [body.stop] : [];
    const stopTokenIds = this.options.ignoreStopTokenIds !== true && Array.isArray(body.stop_token_ids) ? (body.stop_token_ids as number[]) : [];
    let sample = this.#sampler.sample(promptIds, (body.max_tokens as number | undefined) ?? 16, seed, stops, stopTokenIds);
    stats.inflight++;
    stats.maxInflight = Math.max(stats.maxInflight, stats.inflight);
    let answered = false;
    res.on('close', () => {
      if (answered) return;
      this.#inflight.cancel(requestId);
      stats.inflight--;
      stats.disconnected++;
    });
    const perRequest = this.options.requestLatencyMs?.({ index, body });
    const tokenLatencyMs = perRequest === undefined ? (this.options.tokenLatencyMs ?? 0) : perRequest / Math.max(1, sample.ids.length);
    const outcome = await this.#inflight.run(requestId, sample.ids.length, tokenLatencyMs);
    if (res.destroyed) return;
    answered = true;
    stats.inflight--;
    stats.served++;
    if (outcome.aborted) sample = abortedSample(sample, outcome.produced);
    this.options.onCompletion?.({ promptIds, tokenIds: sample.ids, logprobs: sample.logprobs, finishReason: sample.finish });
    res.writeHead(200, OK_JSON).end(this.#render(body, index, sample, fault?.kind === 'tamper' ? fault.tamper : undefined));
  }

  #validate(body: Record<string, unknown>): { status: number; message: string } | undefined {
    if (body.model !== undefined && body.model !== this.model) {
      return { status: 404, message: `The model \`${String(body.model)}\` does not exist.` };
    }
    const prompt = body.prompt;
    if (!Array.isArray(prompt) || prompt.length === 0 || !prompt.every((x) => Number.isInteger(x) && x >= 0)) {
      return { status: 400, message: 'FakeVllmEngine accepts only a non-empty list of token ids as prompt' };
    }
    if (body.stream === true || (body.n !== undefined && body.n !== 1)) return { status: 400, message: 'stream and n > 1 are not faked' };
    const maxTokens = body.max_tokens ?? 16;
    if (!Number.isInteger(maxTokens) || (maxTokens as number) < 1) return { status: 400, message: 'max_tokens must be >= 1' };
    const limit = this.options.maxModelLen ?? 40960;
    if (prompt.length >= limit) {
      return { status: 400, message: `This model's maximum context length is ${limit} tokens. However, your request has ` +
        `${prompt.length} input tokens. Please reduce the length of the input messages.` };
    }
    if (prompt.length + (maxTokens as number) > limit) {
      return { status: 400, message: `This model's maximum context length is ${limit} tokens. However, you requested ` +
        `${prompt.length + (maxTokens as number)} tokens (${prompt.length} in the messages, ${String(maxTokens)} in the completion). ` +
        'Please reduce the length of the messages or completion.' };
    }
    return undefined;
  }

  /** Shapes a sample the way vLLM's non-streaming completion endpoint does. */
  #render(body: Record<string, unknown>, index: number, sample: FakeSample, tamper?: Tamper): string {
    const { tokenizer } = this.options;
    const promptIds = body.prompt as number[];
    const { ids, logprobs, finish, stopReason } = sample;
    // vLLM leaves the terminating stop token out of the text; other special tokens stay unless skipped.
    const textIds = finish === 'stop' && stopReason === null ? ids.slice(0, -1) : ids;
    const decoded = tokenizer.decode(textIds, { skipSpecialTokens: body.skip_special_tokens !== false });
    // The text stops before a matched stop string (its tokens are in the ids), as vLLM's does.
    const outText = stopReason !== null && decoded.includes(stopReason) ? decoded.slice(0, decoded.indexOf(stopReason)) : decoded;
    const wantIds = body.return_token_ids === true;
    const choice = {
      index: 0,
      text: outText,
      logprobs: typeof body.logprobs === 'number' ? completionLogprobs(tokenizer, ids, logprobs, body.return_tokens_as_token_ids === true) : null,
      finish_reason: finish,
      stop_reason: sample.stopTokenId ?? stopReason,
      token_ids: wantIds ? ids : null,
      prompt_logprobs: null,
      prompt_token_ids: wantIds ? promptIds : null,
    };
    // Usage counts what was sampled, whatever a tamper does to the choice (unless it changes usage too).
    const usage = { prompt_tokens: promptIds.length, total_tokens: promptIds.length + ids.length, completion_tokens: ids.length,
      prompt_tokens_details: null };
    const answer = { id: `cmpl-fake-${index}`, object: 'text_completion', created: nowSeconds(), model: this.model, choices: [choice], usage };
    tamper?.(choice, answer);
    return JSON.stringify(answer);
  }
}

/**
 * vLLM's CompletionLogProbs for `logprobs: 0`: the sampled token only, in every per-token list; with
 * `return_tokens_as_token_ids` each token is `"token_id:<id>"` (text offsets then count those strings, as vLLM's do).
 */
function completionLogprobs(tokenizer: Tokenizer, ids: readonly number[], logprobs: readonly number[], asIds: boolean) {
  const tokens = ids.map((id) => (asIds ? `token_id:${id}` : tokenizer.decode([id])));
  const textOffset: number[] = [];
  let offset = 0;
  for (const token of tokens) {
    textOffset.push(offset);
    offset += token.length;
  }
  return { text_offset: textOffset, token_logprobs: logprobs, tokens, top_logprobs: tokens.map((t, i) => ({ [t]: logprobs[i] })) };
}

function sendError(res: ServerResponse, status: number, type: string, message: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, { ...OK_JSON, ...headers }).end(JSON.stringify({ error: { message, type, param: null, code: status } }));
}

function nowSeconds(): number {
  return Math.floor(Date.now() / 1000);
}
