import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { RolloutError } from '../errors.js';

/** Error bodies (non-2xx) are read up to this many bytes; the rest is dropped with the connection. */
export const MAX_ERROR_BODY_BYTES = 64 * 1024;
/** Health, model-info and control answers are small; more than this is refused. */
export const MAX_INFO_BODY_BYTES = 1 << 20;

/** A non-2xx answer from an engine, kept as the cause of the backend_error: its message is the engine's body. */
export class EngineHttpError extends Error {
  constructor(readonly status: number, readonly body: string) {
    super(body.trim() === '' ? '(empty body)' : body.slice(0, 4096));
    this.name = 'EngineHttpError';
  }
}

/**
 * The engine could not be talked to: the connection was refused, reset or dropped before a whole answer arrived
 * (the process died, the node went away). A backend_error like any other to callers outside the pool; the pool
 * reads it as "this engine may be gone": it checks the engine's health at once and moves the trajectory (see
 * BackendPool). Timeouts are not transport failures: a slow engine is alive.
 */
export class EngineUnreachableError extends RolloutError {
  constructor(message: string, options: { cause?: unknown } = {}) {
    super('backend_error', message, options);
    this.name = 'EngineUnreachableError';
  }
}

/** One engine answer: its status and its (bounded) body as text. */
export interface HttpAnswer {
  status: number;
  text: string;
}

/** Where an engine is and how its requests are bounded. */
export interface EngineHttpOptions {
  /** Base URL without a trailing slash. */
  url: string;
  /** Names the engine in messages: "vLLM", "SGLang". */
  label: string;
  /** Budget of one request; past it the request is destroyed and fails with backend_error. 0 = none. */
  requestTimeoutMs?: number;
  /** Open connections kept to the engine (keep-alive); requests beyond wait for one. Default 1024. */
  maxSockets?: number;
}

/** A request id goes into an HTTP header: printable ASCII without spaces, at most 256 characters. */
const REQUEST_ID = /^[\x21-\x7e]{1,256}$/;

/** Throws invalid_argument (field request_id) unless `id` can travel as a header value and a JSON string. */
export function checkRequestId(id: string): void {
  if (!REQUEST_ID.test(id)) throw RolloutError.invalid('request_id', 'must be 1-256 printable ASCII characters without spaces');
}

/**
 * The HTTP seam shared by every engine client: node:http with a keep-alive agent (fetch cost ~0.5 ms of CPU per
 * request in bench/orchestration, a quarter of the server's per-turn budget) and bodies bounded in bytes.
 *
 * Invariants: a 2xx body larger than the caller's cap fails at once (declared content-length) or as soon as the
 * bytes read pass it — the connection is destroyed and nothing more is read or kept, so no engine answer can
 * exhaust the server's memory; an error body is kept up to {@link MAX_ERROR_BODY_BYTES} and the rest dropped the
 * same way. Failures become RolloutError('backend_error') naming the engine (timeouts, refused or dropped
 * connections, oversized answers) — refused, reset and dropped connections as its subclass
 * {@link EngineUnreachableError} —, except an abort of the caller's signal, which keeps its meaning
 * (cancelled / deadline_exceeded).
 */
export class EngineHttp {
  readonly url: string;
  readonly label: string;
  readonly #timeoutMs: number;
  readonly #https: boolean;
  readonly #agent: HttpAgent;
  /** Host, port and base path of `url`, parsed once (a URL parsed per request was a visible share of its CPU). */
  readonly #target: { protocol: string; hostname: string; port: string; base: string; auth: string };

  constructor(options: EngineHttpOptions) {
    this.url = options.url.replace(/\/+$/, '');
    const parsed = new URL(this.url);
    this.#target = {
      protocol: parsed.protocol,
      // [::1] is ::1 to the socket.
      hostname: parsed.hostname.replace(/^\[(.*)\]$/, '$1'),
      port: parsed.port,
      base: parsed.pathname.replace(/\/+$/, '') + parsed.search,
      auth: parsed.username === '' ? '' : `${decodeURIComponent(parsed.username)}:${decodeURIComponent(parsed.password)}`,
    };
    this.label = options.label;
    this.#timeoutMs = options.requestTimeoutMs ?? 0;
    this.#https = this.url.startsWith('https:');
    const agentOptions = { keepAlive: true, maxSockets: options.maxSockets ?? 1024 };
    this.#agent = this.#https ? new HttpsAgent(agentOptions) : new HttpAgent(agentOptions);
  }

  /** Closes idle keep-alive connections (when the backend is removed). */
  close(): void {
    this.#agent.destroy();
  }

  /**
   * One exchange; `body` is sent as JSON when given, in pieces when it is an array (written one after the other,
   * never joined: a 64K-token prompt is not copied into one more 400 KB string). See the class for the bounds.
   */
  async request(
    method: 'GET' | 'POST',
    path: string,
    body: string | readonly string[] | undefined,
    signal: AbortSignal,
    cap: number,
    extraHeaders: Record<string, string> = {},
  ): Promise<HttpAnswer> {
    if (signal.aborted) throw RolloutError.from(signal.reason, 'cancelled');
    let timedOut = false;
    let cleanup = (): void => undefined;
    try {
      return await new Promise<HttpAnswer>((resolve, reject) => {
        const send = this.#https ? httpsRequest : httpRequest;
        const headers: Record<string, string | number> = { ...extraHeaders };
        const pieces = body === undefined ? [] : typeof body === 'string' ? [body] : body;
        if (body !== undefined) {
          headers['content-type'] = 'application/json';
          headers['content-length'] = pieces.reduce((n, p) => n + Buffer.byteLength(p), 0);
        }
        const { protocol, hostname, port, base, auth } = this.#target;
        const target = { protocol, hostname, ...(port !== '' && { port }), path: `${base}${path}`, ...(auth !== '' && { auth }) };
        const req = send({ ...target, method, agent: this.#agent, headers }, (res: IncomingMessage) => {
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
                `${this.label} ${this.url} sent a ${method} ${path} answer larger than the ${limit}-byte cap ` +
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
        // Written before the connection is assigned, the pieces go out together (one writev).
        for (const piece of pieces) req.write(piece);
        req.end();
      });
    } catch (err) {
      if (signal.aborted) throw RolloutError.from(signal.reason, 'cancelled');
      if (err instanceof RolloutError) throw err;
      if (timedOut) {
        throw new RolloutError('backend_error', `${this.label} ${this.url} did not answer within ${this.#timeoutMs} ms`, { cause: err });
      }
      throw new EngineUnreachableError(`${this.label} ${this.url} unreachable: ${describe(err)}`, { cause: err });
    } finally {
      cleanup();
    }
  }

  /**
   * A control call (pause, resume, abort): POST with a small JSON body; any 2xx is success, anything else a
   * backend_error whose cause carries the engine's status and body.
   */
  async control(path: string, body: unknown, signal: AbortSignal): Promise<void> {
    const { status, text } = await this.request('POST', path, body === undefined ? undefined : JSON.stringify(body), signal, MAX_INFO_BODY_BYTES);
    if (status < 200 || status >= 300) {
      throw new RolloutError('backend_error', `${this.label} ${this.url} answered HTTP ${status} to POST ${path}`, { cause: new EngineHttpError(status, text) });
    }
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

/** A health endpoint: true on 2xx, false on anything else, a refused connection or a timeout (never throws). */
export async function probeHealth(http: EngineHttp, path: string, signal: AbortSignal): Promise<boolean> {
  try {
    const { status } = await http.request('GET', path, undefined, signal, MAX_INFO_BODY_BYTES);
    return status >= 200 && status < 300;
  } catch {
    return false;
  }
}

/**
 * The `max_model_len` of `model`'s card in an OpenAI-style GET /v1/models answer (vLLM and SGLang both serve one):
 * the card whose id is the model, or the only card when the engine serves one under another name. Undefined when
 * the card states no usable length; backend_error when the engine answers an error, not JSON, or no such card.
 */
export async function modelCardMaxLen(http: EngineHttp, engine: string, model: string, signal: AbortSignal): Promise<number | undefined> {
  const { status, text } = await http.request('GET', '/v1/models', undefined, signal, MAX_INFO_BODY_BYTES);
  if (status < 200 || status >= 300) {
    throw new RolloutError('backend_error', `${engine} answered HTTP ${status} to GET /v1/models`, { cause: new EngineHttpError(status, text) });
  }
  let data: unknown;
  try {
    data = (JSON.parse(text) as { data?: unknown } | null)?.data;
  } catch (err) {
    throw new RolloutError('backend_error', `${engine} sent a /v1/models answer that is not JSON`, { cause: err });
  }
  const cards = Array.isArray(data) ? data.filter((c): c is Record<string, unknown> => typeof c === 'object' && c !== null) : [];
  const card = cards.find((c) => c.id === model) ?? (cards.length === 1 ? cards[0] : undefined);
  if (card === undefined) throw new RolloutError('backend_error', `${engine} does not list model ${JSON.stringify(model)} in /v1/models`);
  const len = card.max_model_len;
  return typeof len === 'number' && Number.isSafeInteger(len) && len > 0 ? len : undefined;
}
