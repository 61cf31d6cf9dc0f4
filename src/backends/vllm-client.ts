import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { RolloutError } from '../errors.js';
import type { EngineClient, GenerateRequest, GenerateResult } from './types.js';

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
}

/** A non-2xx answer from the engine, kept as the cause of the backend_error (status and body for the log). */
export class VllmHttpError extends Error {
  constructor(readonly status: number, readonly body: string) {
    super(`HTTP ${status}: ${body.slice(0, 500)}`);
    this.name = 'VllmHttpError';
  }
}

const FINISH_REASONS = new Set<GenerateResult['finishReason']>(['stop', 'length', 'abort']);

/**
 * Talks to a vLLM OpenAI-compatible server through `/v1/completions` with a token-id prompt ("token in, token
 * out"): the prompt goes as a list of ids, `return_token_ids: true` brings back the sampled ids
 * (`choices[0].token_ids`, vLLM >= 0.10.2) and `logprobs: 0` the logprob of each sampled token only
 * (`choices[0].logprobs.token_logprobs`). Both are used exactly as returned, never re-derived from text, so the
 * trainer sees the very tokens the policy sampled. `skip_special_tokens: false` keeps the stop token (e.g.
 * <|im_end|>) visible in the informational text.
 *
 * Errors: HTTP errors, timeouts, refused connections and malformed answers become RolloutError('backend_error')
 * with the cause attached; an abort of the caller's signal keeps its meaning (cancelled / deadline_exceeded).
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
  readonly #https: boolean;
  readonly #agent: HttpAgent;

  constructor(options: VllmClientOptions) {
    this.url = options.url.replace(/\/+$/, '');
    this.model = options.model;
    this.#timeoutMs = options.requestTimeoutMs ?? 0;
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

    const { status, text } = await this.#post('/v1/completions', JSON.stringify(body), request.signal);
    if (status < 200 || status >= 300) {
      throw new RolloutError('backend_error', `vLLM ${this.url} answered HTTP ${status}`, { cause: new VllmHttpError(status, text) });
    }
    return this.#parse(text);
  }

  /** GET /health: vLLM answers 200 with an empty body when the engine is alive, 503 when it is dead. */
  async health(signal: AbortSignal): Promise<boolean> {
    try {
      const response = await fetch(`${this.url}/health`, { signal });
      await response.arrayBuffer();
      return response.ok;
    } catch {
      return false;
    }
  }

  async #post(path: string, body: string, signal: AbortSignal): Promise<{ status: number; text: string }> {
    if (signal.aborted) throw RolloutError.from(signal.reason, 'cancelled');
    let timedOut = false;
    let cleanup = (): void => undefined;
    try {
      return await new Promise<{ status: number; text: string }>((resolve, reject) => {
        const send = this.#https ? httpsRequest : httpRequest;
        const req = send(
          `${this.url}${path}`,
          { method: 'POST', agent: this.#agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
          (res: IncomingMessage) => {
            const chunks: Buffer[] = [];
            res.on('data', (chunk: Buffer) => chunks.push(chunk));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }));
            res.on('error', reject);
            res.on('aborted', () => reject(new Error('response aborted')));
          },
        );
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
      if (timedOut) {
        throw new RolloutError('backend_error', `vLLM ${this.url} did not answer within ${this.#timeoutMs} ms`, { cause: err });
      }
      throw new RolloutError('backend_error', `vLLM ${this.url} unreachable: ${describe(err)}`, { cause: err });
    } finally {
      cleanup();
    }
  }

  #parse(text: string): GenerateResult {
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch (err) {
      throw this.#malformed('body is not JSON', err);
    }
    const choice = (json as { choices?: unknown[] } | null)?.choices?.[0] as Record<string, unknown> | undefined;
    if (typeof choice !== 'object' || choice === null) throw this.#malformed('no choices[0]');
    const tokenIds = choice.token_ids;
    if (!Array.isArray(tokenIds) || !tokenIds.every(Number.isInteger)) {
      throw this.#malformed('choices[0].token_ids missing or not integers (vLLM >= 0.10.2 with return_token_ids needed)');
    }
    const logprobs = (choice.logprobs as { token_logprobs?: unknown } | null | undefined)?.token_logprobs;
    if (!Array.isArray(logprobs) || !logprobs.every((x) => typeof x === 'number' && Number.isFinite(x))) {
      throw this.#malformed('choices[0].logprobs.token_logprobs missing or not numbers');
    }
    if (logprobs.length !== tokenIds.length) {
      throw this.#malformed(`${tokenIds.length} token ids but ${logprobs.length} logprobs`);
    }
    const finishReason = choice.finish_reason as GenerateResult['finishReason'];
    if (!FINISH_REASONS.has(finishReason)) throw this.#malformed(`unexpected finish_reason ${JSON.stringify(finishReason)}`);
    return {
      tokenIds: tokenIds as number[],
      logprobs: logprobs as number[],
      finishReason,
      text: typeof choice.text === 'string' ? choice.text : '',
    };
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
