import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { RolloutError } from '../errors.js';
import { checkCompletion, CompletionRejected } from './completion.js';
import { ContextOverflowError, parseContextOverflow } from './context-overflow.js';
import type { EngineClient, EngineModelInfo, GenerateRequest, GenerateResult } from './types.js';

/** Where a vLLM server is and how long one request may take. */
export interface VllmClientOptions {
  /** Base URL of the server, without `/v1` (e.g. `http://gpu-node-3:8000`). */
  url: string;
  /** Served model name, sent as `model` (vLLM's `--served-model-name`). */
  model: string;
  /** Budget of one completion request; past it the request is aborted and fails with backend_error. 0 = none. */
  requestTimeoutMs?: number;
  /** Open connections kept to the engine (keep-alive); requests beyond wait for one. Default 1024. */
  maxSockets?: number;
  /**
   * Largest completion body accepted, in bytes; a bigger answer fails with backend_error as soon as the cap is
   * passed (the connection is destroyed, the rest never read). Default (0 or absent): per request,
   * {@link defaultMaxResponseBytes} of its prompt length and max_tokens.
   */
  maxResponseBytes?: number;
}

/** Error bodies (non-2xx) are read up to this many bytes; the rest is dropped with the connection. */
export const MAX_ERROR_BODY_BYTES = 64 * 1024;
/** GET /v1/models and /health bodies are small; more than this is refused. */
const MAX_INFO_BODY_BYTES = 1 << 20;

/**
 * The default cap on a completion body: 64 KiB of envelope, 1 KiB per requested token (a token appears in
 * `token_ids`, `token_logprobs`, `tokens`, `top_logprobs`, `text_offset` and `text`; ~50 bytes typically, a few
 * hundred when its text is JSON-escaped) and 16 bytes per prompt token (vLLM echoes `prompt_token_ids`). Generous
 * for any honest answer, and still far below the ~512 MiB at which Node cannot even hold the body as a string.
 */
export function defaultMaxResponseBytes(promptTokens: number, maxTokens: number): number {
  return 64 * 1024 + 1024 * maxTokens + 16 * promptTokens;
}

/** A non-2xx answer from the engine, kept as the cause of the backend_error: its message is the engine's body. */
export class VllmHttpError extends Error {
  constructor(readonly status: number, readonly body: string) {
    super(body.trim() === '' ? '(empty body)' : body.slice(0, 4096));
    this.name = 'VllmHttpError';
  }
}

interface HttpAnswer {
  status: number;
  text: string;
}

/**
 * Talks to a vLLM OpenAI-compatible server through `/v1/completions` with a token-id prompt ("token in, token
 * out"): the prompt goes as a list of ids, `return_token_ids: true` brings back the sampled ids
 * (`choices[0].token_ids`, vLLM >= 0.10.2) and `logprobs: 0` the logprob of each sampled token only
 * (`choices[0].logprobs.token_logprobs`). Both are used exactly as returned, never re-derived from text, so the
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
 * @example
 * const client = new VllmClient({ url: 'http://127.0.0.1:8000', model: 'Qwen/Qwen3-8B', requestTimeoutMs: 600_000 });
 * const out = await client.generate({ promptIds, maxTokens: 1024, temperature: 1, signal });
 */
export class VllmClient implements EngineClient {
  readonly kind = 'vllm' as const;
  readonly url: string;
  readonly model: string;
  readonly #timeoutMs: number;
  readonly #maxResponseBytes: number;
  readonly #https: boolean;
  readonly #agent: HttpAgent;

  constructor(options: VllmClientOptions) {
    this.url = options.url.replace(/\/+$/, '');
    this.model = options.model;
    this.#timeoutMs = options.requestTimeoutMs ?? 0;
    this.#maxResponseBytes = options.maxResponseBytes ?? 0;
    this.#https = this.url.startsWith('https:');
    // node:http with a keep-alive agent, not fetch: fetch cost ~0.5 ms of CPU per request in
    // bench/orchestration, a quarter of the server's whole per-turn budget.
    const agentOptions = { keepAlive: true, maxSockets: options.maxSockets ?? 1024 };
    this.#agent = this.#https ? new HttpsAgent(agentOptions) : new HttpAgent(agentOptions);
  }

  /** Closes idle keep-alive connections (when the backend is removed). */
  close(): void {
    this.#agent.destroy();
  }

  async generate(request: GenerateRequest): Promise<GenerateResult> {
    const body: Record<string, unknown> = {
      model: this.model,
      prompt: request.promptIds,
      max_tokens: request.maxTokens,
      logprobs: 0,
      return_token_ids: true,
      skip_special_tokens: false,
      stream: false,
    };
    if (request.temperature !== undefined) body.temperature = request.temperature;
    if (request.topP !== undefined) body.top_p = request.topP;
    if (request.topK !== undefined) body.top_k = request.topK;
    if (request.seed !== undefined) body.seed = request.seed;
    if (request.stop !== undefined && request.stop.length > 0) body.stop = request.stop;

    const cap = this.#maxResponseBytes > 0 ? this.#maxResponseBytes : defaultMaxResponseBytes(request.promptIds.length, request.maxTokens);
    const { status, text } = await this.#request('POST', '/v1/completions', JSON.stringify(body), request.signal, cap);
    if (status < 200 || status >= 300) {
      const cause = new VllmHttpError(status, text);
      const overflow = parseContextOverflow(status, text, request.maxTokens > 0 ? request.promptIds.length : undefined);
      if (overflow) {
        throw new ContextOverflowError(
          overflow.maxModelLen,
          overflow.promptTokens,
          `vLLM ${this.url}: ${request.promptIds.length} context + ${request.maxTokens} max_tokens exceed max_model_len ${overflow.maxModelLen}`,
          cause,
        );
      }
      throw new RolloutError('backend_error', `vLLM ${this.url} answered HTTP ${status}`, { cause });
    }
    let json: unknown;
    try {
      // V8's JSON.parse is iterative (no stack overflow on deep nesting) and the body is bounded by `cap`, so
      // parsing is bounded too; checkCompletion copies out only the checked primitives.
      json = JSON.parse(text);
    } catch (err) {
      throw this.#malformed('body is not JSON', err);
    }
    try {
      return checkCompletion(json, { maxTokens: request.maxTokens, ...(request.vocabSize !== undefined && { vocabSize: request.vocabSize }) });
    } catch (err) {
      if (err instanceof CompletionRejected) throw this.#malformed(err.reason);
      throw err;
    }
  }

  /** GET /health: vLLM answers 200 with an empty body when the engine is alive, 503 when it is dead. */
  async health(signal: AbortSignal): Promise<boolean> {
    try {
      const { status } = await this.#request('GET', '/health', undefined, signal, MAX_INFO_BODY_BYTES);
      return status >= 200 && status < 300;
    } catch {
      return false;
    }
  }

  /**
   * GET /v1/models: vLLM lists the served model names with their `max_model_len`. The card whose id is this
   * client's model is used (or the only card, when the engine serves one under another name).
   */
  async modelInfo(signal: AbortSignal): Promise<EngineModelInfo> {
    const { status, text } = await this.#request('GET', '/v1/models', undefined, signal, MAX_INFO_BODY_BYTES);
    if (status < 200 || status >= 300) {
      throw new RolloutError('backend_error', `vLLM ${this.url} answered HTTP ${status} to GET /v1/models`, { cause: new VllmHttpError(status, text) });
    }
    let data: unknown;
    try {
      data = (JSON.parse(text) as { data?: unknown } | null)?.data;
    } catch (err) {
      throw new RolloutError('backend_error', `vLLM ${this.url} sent a /v1/models answer that is not JSON`, { cause: err });
    }
    const cards = Array.isArray(data) ? data.filter((c): c is Record<string, unknown> => typeof c === 'object' && c !== null) : [];
    const card = cards.find((c) => c.id === this.model) ?? (cards.length === 1 ? cards[0] : undefined);
    if (card === undefined) throw new RolloutError('backend_error', `vLLM ${this.url} does not list model ${JSON.stringify(this.model)} in /v1/models`);
    const len = card.max_model_len;
    return typeof len === 'number' && Number.isSafeInteger(len) && len > 0 ? { maxModelLen: len } : {};
  }

  /**
   * One HTTP exchange with bounded bodies: a 2xx body larger than `cap` fails at once (declared length) or as
   * soon as the bytes read pass it — the connection is destroyed, nothing more is read or kept; an error body is
   * kept up to {@link MAX_ERROR_BODY_BYTES} and the rest dropped the same way.
   */
  async #request(method: 'GET' | 'POST', path: string, body: string | undefined, signal: AbortSignal, cap: number): Promise<HttpAnswer> {
    if (signal.aborted) throw RolloutError.from(signal.reason, 'cancelled');
    let timedOut = false;
    let cleanup = (): void => undefined;
    try {
      return await new Promise<HttpAnswer>((resolve, reject) => {
        const send = this.#https ? httpsRequest : httpRequest;
        const headers: Record<string, string | number> = body === undefined ? {} : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) };
        const req = send(`${this.url}${path}`, { method, agent: this.#agent, headers }, (res: IncomingMessage) => {
          const status = res.statusCode ?? 0;
          const ok = status >= 200 && status < 300;
          const limit = ok ? cap : Math.min(cap, MAX_ERROR_BODY_BYTES);
          const chunks: Buffer[] = [];
          let size = 0;
          let done = false;
          const tooLarge = (seen: number, declared: boolean): void => {
            done = true;
            reject(
              new RolloutError(
                'backend_error',
                `vLLM ${this.url} sent a ${method} ${path} answer larger than the ${limit}-byte cap ` +
                  `(${declared ? `content-length ${seen}` : `stopped reading at ${seen} bytes`})`,
              ),
            );
            req.destroy();
          };
          const finish = (truncated: boolean): void => {
            done = true;
            resolve({ status, text: Buffer.concat(chunks, size).toString('utf8') });
            if (truncated) req.destroy();
          };
          const declared = Number(res.headers['content-length']);
          if (ok && Number.isFinite(declared) && declared > limit) return tooLarge(declared, true);
          res.on('data', (chunk: Buffer) => {
            if (done) return;
            if (size + chunk.length <= limit) {
              chunks.push(chunk);
              size += chunk.length;
            } else if (ok) {
              tooLarge(size + chunk.length, false);
            } else {
              chunks.push(chunk.subarray(0, limit - size));
              size = limit;
              finish(true);
            }
          });
          res.on('end', () => {
            if (!done) finish(false);
          });
          res.on('error', reject);
          res.on('aborted', () => reject(new Error('response aborted')));
        });
        req.on('error', reject);
        const onAbort = (): void => {
          req.destroy();
          reject(signal.reason);
        };
        signal.addEventListener('abort', onAbort, { once: true });
        const timer =
          this.#timeoutMs > 0
            ? setTimeout(() => {
                timedOut = true;
                req.destroy(new Error('request timeout'));
              }, this.#timeoutMs)
            : undefined;
        cleanup = () => {
          clearTimeout(timer);
          signal.removeEventListener('abort', onAbort);
        };
        req.end(body);
      });
    } catch (err) {
      if (signal.aborted) throw RolloutError.from(signal.reason, 'cancelled');
      if (err instanceof RolloutError) throw err;
      if (timedOut) {
        throw new RolloutError('backend_error', `vLLM ${this.url} did not answer within ${this.#timeoutMs} ms`, { cause: err });
      }
      throw new RolloutError('backend_error', `vLLM ${this.url} unreachable: ${describe(err)}`, { cause: err });
    } finally {
      cleanup();
    }
  }

  #malformed(what: string, cause?: unknown): RolloutError {
    return new RolloutError('backend_error', `vLLM ${this.url} sent a malformed completion: ${what}`, { cause });
  }
}

/** The useful part of a connection error: its code (ECONNREFUSED, ECONNRESET, ...), here or in its cause. */
function describe(err: unknown): string {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string') return code;
  const cause = (err as { cause?: { code?: unknown; message?: unknown } } | null)?.cause;
  if (typeof cause?.code === 'string') return cause.code;
  if (typeof cause?.message === 'string') return cause.message;
  return err instanceof Error ? err.message : String(err);
}
