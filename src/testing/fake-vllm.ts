import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Tokenizer } from '../tokens/types.js';
import { hashInts } from './arithmetic.js';
import { policyContext, scriptedMathPolicy, type FakePolicy } from './scripted-policy.js';

/**
 * A fault to inject into one completion request: an HTTP error, a dropped connection, no answer at all, a
 * completion tampered with before it is sent (ids out of vocabulary, positive logprobs, more tokens than asked
 * for...), or a 200 answer of `bytes` bytes streamed as the client reads them (generated on the fly, never held in
 * memory; it stops when the client goes away).
 */
export type InjectedFailure =
  | { kind: 'status'; status: number; message?: string }
  | { kind: 'drop' }
  | { kind: 'hang' }
  | { kind: 'tamper'; tamper: (choice: Record<string, unknown>) => void }
  | { kind: 'oversized'; bytes: number };

/** Behaviour of a FakeVllmEngine: tokenizer, speed, policy and faults. */
export interface FakeVllmOptions {
  /** The canonical tokenizer: prompts are decoded and answers encoded with it, as a real engine would. */
  tokenizer: Tokenizer;
  /** Served model name (`--served-model-name`); requests naming another model get 404 like vLLM. */
  model?: string;
  /** Simulated decode time per generated token, in ms; 0 answers at once (benchmarks). */
  tokenLatencyMs?: number;
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
  /** Sees every completion the engine returns, so tests can compare trajectories with what was sampled. */
  onCompletion?: (completion: { promptIds: readonly number[]; tokenIds: readonly number[]; logprobs: readonly number[]; finishReason: 'stop' | 'length' }) => void;
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
}

const OK_JSON = { 'content-type': 'application/json' };

/**
 * TEST DOUBLE: a real HTTP server on 127.0.0.1 that speaks the subset of vLLM's OpenAI-compatible API the
 * rollout server uses — `POST /v1/completions` with a token-id prompt, `logprobs`, `return_token_ids`, `stop`,
 * `seed`; `GET /health`; `GET /v1/models` — with vLLM-shaped JSON. A scripted policy writes the assistant text,
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
  readonly #stats: FakeVllmStats = { received: 0, served: 0, failed: 0, disconnected: 0, inflight: 0, maxInflight: 0, healthChecks: 0, oversizedBytesSent: 0 };
  readonly #faults: InjectedFailure[] = [];
  readonly #stopId: number;
  #healthy = true;
  #listModels: boolean;
  #url = '';

  private constructor(
    private readonly options: FakeVllmOptions,
    private readonly server: Server,
  ) {
    this.model = options.model ?? 'fake-qwen3';
    this.#listModels = options.listModels ?? true;
    const stopId = options.tokenizer.tokenId('<|im_end|>') ?? options.tokenizer.stopTokenIds[0];
    if (stopId === undefined) throw new Error('FakeVllmEngine: the tokenizer has no stop token');
    this.#stopId = stopId;
  }

  /** Starts listening on 127.0.0.1 on a free port. */
  static async start(options: FakeVllmOptions): Promise<FakeVllmEngine> {
    const server = createServer();
    const engine = new FakeVllmEngine(options, server);
    server.on('request', (req, res) => void engine.#route(req, res));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => resolve());
    });
    engine.#url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    return engine;
  }

  /** Base URL, e.g. `http://127.0.0.1:40123` (no `/v1`). */
  get url(): string {
    return this.#url;
  }

  get requestsServed(): number {
    return this.#stats.served;
  }

  stats(): FakeVllmStats {
    return { ...this.#stats };
  }

  /** The next `count` completion requests fail with `failure` (default: HTTP 500). */
  failNext(count: number, failure: InjectedFailure = { kind: 'status', status: 500 }): void {
    for (let i = 0; i < count; i++) this.#faults.push(failure);
  }

  /** What `/health` answers: 200 when healthy, 503 (vLLM's "engine dead") when not. */
  setHealthy(healthy: boolean): void {
    this.#healthy = healthy;
  }

  /** Whether GET /v1/models answers (true) or is a 404 (false), e.g. to test learning the limit later. */
  setModelsListed(listed: boolean): void {
    this.#listModels = listed;
  }

  /** Stops the server and drops every open connection (hanging requests included). */
  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    this.server.closeAllConnections();
    await closed;
  }

  async #route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method === 'GET' && path === '/health') {
      this.#stats.healthChecks++;
      res.writeHead(this.#healthy ? 200 : 503).end();
    } else if (req.method === 'GET' && path === '/v1/models' && this.#listModels) {
      const card = { id: this.model, object: 'model', created: nowSeconds(), owned_by: 'vllm', root: this.model, parent: null,
        max_model_len: this.options.maxModelLen ?? 40960, permission: [] };
      res.writeHead(200, OK_JSON).end(JSON.stringify({ object: 'list', data: [card] }));
    } else if (req.method === 'POST' && path === '/v1/completions') {
      await this.#complete(req, res);
    } else {
      sendError(res, 404, 'NotFoundError', `no route ${req.method} ${path}`);
    }
  }

  async #complete(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const stats = this.#stats;
    const index = stats.received++;
    let body: Record<string, unknown>;
    try {
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
    } catch {
      stats.failed++;
      return sendError(res, 400, 'BadRequestError', 'request body is not JSON');
    }
    this.lastRequest = body;
    const fault = this.#faults.shift() ?? this.options.inject?.({ index, body });
    if (fault !== undefined && fault.kind !== 'tamper') {
      stats.failed++;
      if (fault.kind === 'drop') return void req.socket.destroy();
      if (fault.kind === 'hang') return;
      if (fault.kind === 'oversized') return this.#streamOversized(res, fault.bytes);
      return sendError(res, fault.status, 'InternalServerError', fault.message ?? 'injected failure');
    }
    const invalid = this.#validate(body);
    if (invalid !== undefined) {
      stats.failed++;
      return sendError(res, invalid.status, invalid.status === 404 ? 'NotFoundError' : 'BadRequestError', invalid.message);
    }
    const completion = this.#generate(body, index, fault?.kind === 'tamper' ? fault.tamper : undefined);
    stats.inflight++;
    stats.maxInflight = Math.max(stats.maxInflight, stats.inflight);
    const delay = (this.options.tokenLatencyMs ?? 0) * completion.tokenCount;
    const send = (): void => {
      stats.inflight--;
      stats.served++;
      res.writeHead(200, OK_JSON).end(completion.json);
    };
    if (delay <= 0) return send();
    const timer = setTimeout(send, delay);
    res.on('close', () => {
      if (res.writableFinished) return;
      clearTimeout(timer);
      stats.inflight--;
      stats.disconnected++;
    });
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

  /**
   * Streams a 200 answer of `bytes` bytes that starts like a completion and never ends being one: a 64 KiB chunk
   * reused for every write, written only as fast as the client reads (backpressure), abandoned when it goes away.
   */
  #streamOversized(res: ServerResponse, bytes: number): void {
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    Buffer.from('{"id":"cmpl-oversized","object":"text_completion","choices":[{"text":"').copy(chunk);
    let left = bytes;
    res.writeHead(200, OK_JSON);
    const pump = (): void => {
      while (left > 0 && !res.destroyed) {
        const piece = left >= chunk.length ? chunk : chunk.subarray(0, left);
        left -= piece.length;
        this.#stats.oversizedBytesSent += piece.length;
        if (!res.write(piece)) return void res.once('drain', pump);
      }
      if (!res.destroyed) res.end();
    };
    res.on('error', () => undefined);
    pump();
  }

  /** Runs the policy and shapes the answer the way vLLM's non-streaming completion endpoint does. */
  #generate(body: Record<string, unknown>, index: number, tamper?: (choice: Record<string, unknown>) => void): { json: string; tokenCount: number } {
    const { tokenizer } = this.options;
    const promptIds = body.prompt as number[];
    const maxTokens = (body.max_tokens as number | undefined) ?? 16;
    const seed = typeof body.seed === 'number' ? body.seed : hashInts(index, 0x5eed);
    let text = (this.options.policy ?? scriptedMathPolicy)(tokenizer.decode(promptIds), policyContext(seed, promptIds));
    let stopReason: string | null = null;
    const stops = Array.isArray(body.stop) ? (body.stop as string[]) : typeof body.stop === 'string' ? [body.stop] : [];
    for (const stop of stops) {
      const at = text.indexOf(stop);
      if (stop !== '' && at >= 0 && (stopReason === null || at < text.indexOf(stopReason))) stopReason = stop;
    }
    if (stopReason !== null) text = text.slice(0, text.indexOf(stopReason));
    let ids = this.options.tokenize ? this.options.tokenize(text) : tokenizer.encode(text);
    if (stopReason === null) ids.push(this.#stopId);
    let finish: 'stop' | 'length' = 'stop';
    if (ids.length > maxTokens) {
      ids = ids.slice(0, maxTokens);
      finish = 'length';
      stopReason = null;
    }
    const logprobs = ids.map((id, i) => -(0.001 + (hashInts(seed, promptIds.length + i, id) % 4000) / 1000));
    this.options.onCompletion?.({ promptIds, tokenIds: ids, logprobs, finishReason: finish });
    // vLLM leaves the terminating stop token out of the text; other special tokens stay unless skipped.
    const textIds = finish === 'stop' && stopReason === null ? ids.slice(0, -1) : ids;
    const outText = tokenizer.decode(textIds, { skipSpecialTokens: body.skip_special_tokens !== false });
    const wantIds = body.return_token_ids === true;
    const choice = {
      index: 0,
      text: outText,
      logprobs: typeof body.logprobs === 'number' ? completionLogprobs(tokenizer, ids, logprobs) : null,
      finish_reason: finish,
      stop_reason: stopReason,
      token_ids: wantIds ? ids : null,
      prompt_logprobs: null,
      prompt_token_ids: wantIds ? promptIds : null,
    };
    tamper?.(choice);
    const usage = { prompt_tokens: promptIds.length, total_tokens: promptIds.length + ids.length, completion_tokens: ids.length,
      prompt_tokens_details: null };
    const response = { id: `cmpl-fake-${index}`, object: 'text_completion', created: nowSeconds(), model: this.model,
      choices: [choice], usage };
    return { json: JSON.stringify(response), tokenCount: ids.length };
  }
}

/** vLLM's CompletionLogProbs for `logprobs: 0`: the sampled token only, in every per-token list. */
function completionLogprobs(tokenizer: Tokenizer, ids: readonly number[], logprobs: readonly number[]) {
  const tokens = ids.map((id) => tokenizer.decode([id]));
  const textOffset: number[] = [];
  let offset = 0;
  for (const token of tokens) {
    textOffset.push(offset);
    offset += token.length;
  }
  return { text_offset: textOffset, token_logprobs: logprobs, tokens, top_logprobs: tokens.map((t, i) => ({ [t]: logprobs[i] })) };
}

function sendError(res: ServerResponse, status: number, type: string, message: string): void {
  res.writeHead(status, OK_JSON).end(JSON.stringify({ error: { message, type, param: null, code: status } }));
}

function nowSeconds(): number {
  return Math.floor(Date.now() / 1000);
}
