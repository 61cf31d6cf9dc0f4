import { Pool, type Dispatcher } from 'undici';
import { RolloutError } from '../errors.js';
import type { JsonPiece } from './prompt-json.js';
import { tooLargeForBudget, type BudgetTicket, type ResponseBudget } from './response-budget.js';

/** Error bodies (non-2xx) are read up to this many bytes; the rest is dropped with the connection. */
export const MAX_ERROR_BODY_BYTES = 64 * 1024;
/** Health, model-info and control answers are small; more than this is refused. */
export const MAX_INFO_BODY_BYTES = 1 << 20;

/**
 * The largest context length, token pool or capacity taken from what an engine says about itself. ListBackends and
 * PauseGeneration carry them as int32 fields (max_model_len, max_concurrency), and no engine has a 2^31-token context
 * or runs 2^31 sequences: taken as said, a larger value made every response listing backends fail to encode
 * (INTERNAL), for all of them — a weight sync's PauseGeneration included.
 */
export const MAX_ENGINE_LIMIT = 2 ** 31 - 1;

/**
 * A limit an engine states (`value`): a positive integer, read as at most {@link MAX_ENGINE_LIMIT} (beyond it every
 * value means the same: no limit this server can reach); undefined for anything else (the engine said nothing usable).
 */
export function engineLimit(value: unknown): number | undefined {
  return typeof value === 'number' && Number.isInteger(value) && value > 0 ? Math.min(value, MAX_ENGINE_LIMIT) : undefined;
}

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

/**
 * How long an answer may send nothing once its headers came. vLLM and SGLang answer a non-streaming request when it is
 * done: headers and body go out together, so a body that stops for this long is a stalled engine or proxy (a hung
 * worker, a half-dead connection), not a long generation — which request timeouts (300 s) must leave alone.
 */
export const DEFAULT_BODY_IDLE_MS = 30_000;

/** One engine answer: its status and its (bounded) body as text. */
export interface HttpAnswer {
  status: number;
  text: string;
  /** A busy answer's (HTTP 429 or 503) Retry-After, in ms from now (see {@link parseRetryAfterMs}); absent otherwise. */
  retryAfterMs?: number;
}

/**
 * A Retry-After header (RFC 9110 §10.2.3) in ms from `now`: delta-seconds (a non-negative integer) or an HTTP-date
 * (a past one is 0); undefined when absent or neither (a fraction, a negative number, words). The first of repeated
 * headers counts. Unbounded here: the pool bounds how long it honours one (BackendPoolOptions.maxRetryAfterMs).
 */
export function parseRetryAfterMs(value: string | string[] | undefined, now = Date.now()): number | undefined {
  const text = (Array.isArray(value) ? value[0] : value)?.trim();
  if (text === undefined || text === '') return undefined;
  if (/^\d+$/.test(text)) return Math.min(Number(text) * 1000, Number.MAX_SAFE_INTEGER);
  // An HTTP-date names its weekday and month in letters: a bare number of another form is not one.
  if (!/^[A-Za-z]{3},? /.test(text)) return undefined;
  const at = Date.parse(text);
  return Number.isFinite(at) ? Math.max(0, at - now) : undefined;
}

/** Where an engine is and how its requests are bounded. */
export interface EngineHttpOptions {
  /**
   * Base URL (a path prefix and a query string are kept on every request, trailing slashes dropped; see
   * {@link engineUrlProblem} for what is refused). Userinfo (`http://user:pass@host:8000`) is sent as HTTP basic auth
   * (`authorization: Basic base64(user:pass)`, as curl and browsers do) and never shown: {@link EngineHttp.url} is the
   * URL without it and with its query values masked (see {@link withoutCredentials}); requests carry both.
   */
  url: string;
  /** Names the engine in messages: "vLLM", "SGLang". */
  label: string;
  /** Budget of one request; past it the request is destroyed and fails with backend_error. 0 = none. */
  requestTimeoutMs?: number;
  /**
   * Once an answer's headers came, the longest it may then send nothing (its body stalled), ms; past it the request
   * fails as unreachable (EngineUnreachableError: the pool checks the engine and moves the trajectory). Default
   * {@link DEFAULT_BODY_IDLE_MS}; 0 = none. Time spent waiting for room in the answer budget does not count.
   */
  bodyIdleTimeoutMs?: number;
  /** Open connections kept to the engine (keep-alive); requests beyond wait for one. Default 1024. */
  maxSockets?: number;
}

/** What stands for a query parameter's value (or a fragment) wherever an engine URL is shown. */
export const URL_SECRET_MASK = '***';

/**
 * `url` as it may be shown (ListBackends, logs, error messages, a backend's default id): without its userinfo, and
 * with every query parameter's value masked ({@link URL_SECRET_MASK}), the rest as given. Both the password and the
 * user name go: a user name alone is often the secret (`https://<token>@host`, which curl sends as basic auth with an
 * empty password), and the engine's address is what an operator needs to tell backends apart. Query values go because
 * gateways take keys there (`?api_key=...`, `?token=...`) and no name reliably tells a key from a setting; the names
 * stay (a bare parameter without `=` may itself be the key: it is masked whole), so does a path (a secret in it is not
 * recognized: pass keys as userinfo or in the query). A fragment, never sent, is masked too. The embedded engine's
 * `file:` and `embedded:` URLs name a local model and its settings (`?sequences=2`), never a secret: their query is
 * shown as given. A URL with nothing to hide is returned unchanged (same text, so ids derived from it stay as they
 * were). The requests themselves go to the URL as given (see {@link EngineHttp}).
 */
export function withoutCredentials(url: string): string {
  const mask = /^(file|embedded):/i.test(url) ? (u: string): string => u : maskQuery;
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    // Not a URL (it is refused elsewhere): still never echo what looks like userinfo or a query's values.
    return mask(url.replace(/\/\/[^/?#\\]*@/, '//'));
  }
  if (parsed.username === '' && parsed.password === '') return mask(url);
  parsed.username = '';
  parsed.password = '';
  // The WHATWG serializer adds a "/" to an empty path; keep the caller's form (with or without a trailing slash).
  const bare = parsed.href.endsWith('/') && !url.endsWith('/') && parsed.search === '' && parsed.hash === '' ? parsed.href.slice(0, -1) : parsed.href;
  return mask(bare);
}

/** `url` with each query parameter's value, a bare parameter, and a fragment replaced by {@link URL_SECRET_MASK}. */
function maskQuery(url: string): string {
  const hash = url.indexOf('#');
  const head = hash < 0 ? url : url.slice(0, hash);
  const fragment = hash < 0 ? '' : `#${URL_SECRET_MASK}`;
  const q = head.indexOf('?');
  if (q < 0) return `${head}${fragment}`;
  const masked = head
    .slice(q + 1)
    .split('&')
    .map((part) => {
      if (part === '') return part;
      const eq = part.indexOf('=');
      return eq < 0 ? URL_SECRET_MASK : `${part.slice(0, eq)}=${URL_SECRET_MASK}`;
    })
    .join('&');
  return `${head.slice(0, q + 1)}${masked}${fragment}`;
}

/** A percent-decoded userinfo part; a malformed escape is sent as written (as curl does) rather than failing. */
function decodeUserinfo(part: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}

/** A request id goes into an HTTP header: printable ASCII without spaces, at most 256 characters. */
const REQUEST_ID = /^[\x21-\x7e]{1,256}$/;

/** Throws invalid_argument (field request_id) unless `id` can travel as a header value and a JSON string. */
export function checkRequestId(id: string): void {
  if (!REQUEST_ID.test(id)) throw RolloutError.invalid('request_id', 'must be 1-256 printable ASCII characters without spaces');
}

/**
 * Why `url` (an http(s) URL) names no engine's base URL, or undefined when it does. Every request path a client sends
 * (`/v1/completions`, `/generate`, `/health`, ...) is appended to the URL's path, so a URL ending in `/v1` — an OpenAI
 * client's base URL, the most common mistake — would send `/v1/v1/completions` and have every request and every
 * probe answered 404; a fragment is never sent at all, so it names nothing. A path prefix (a gateway's `/engines/7`,
 * with or without a trailing slash) and a query string (kept on every request, see {@link requestTarget}) are fine.
 */
export function engineUrlProblem(url: string): string | undefined {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return 'not a URL';
  }
  if (url.includes('#')) return 'a fragment (#...) is never sent to the engine: give its base URL without one';
  if (/(^|\/)v1\/*$/.test(parsed.pathname)) {
    const base = `${parsed.origin}${parsed.pathname.replace(/\/*v1\/*$/, '')}`;
    return `ends in /v1: give the engine server's base URL (here ${withoutCredentials(base)}): the client adds /v1/completions, /generate, /health itself`;
  }
  return undefined;
}

/**
 * The request target of `path` (its own query included, e.g. `/pause?mode=keep`) on an engine whose URL has the path
 * `basePath` and the query parameters `baseQuery`: the base path, the path, then the request's own parameters followed
 * by the URL's, as written — except a URL parameter of a name the request sets itself (the request's value is the one
 * meant, and servers differ on which of two they take).
 */
export function requestTarget(basePath: string, baseQuery: readonly string[], path: string): string {
  if (baseQuery.length === 0) return `${basePath}${path}`;
  const at = path.indexOf('?');
  const own = at < 0 ? [] : path.slice(at + 1).split('&').filter((part) => part !== '');
  const ownNames = new Set(own.map(parameterName));
  const params = [...own, ...baseQuery.filter((part) => !ownNames.has(parameterName(part)))];
  return `${basePath}${at < 0 ? path : path.slice(0, at)}${params.length > 0 ? `?${params.join('&')}` : ''}`;
}

/** The decoded name of one `name=value` query parameter. */
function parameterName(part: string): string {
  return [...new URLSearchParams(part).keys()][0] ?? '';
}

/**
 * The HTTP seam shared by every engine client: an undici {@link Pool} per engine (keep-alive, no pipelining) and
 * bodies bounded in bytes. undici's raw dispatch API costs a fraction of node:http's CPU per request (node:http
 * was ~0.24 ms per request in bench/orchestration, a third of the server's per-turn budget; fetch ~0.5 ms), and it
 * reuses keep-alive connections safely: it honours the engine's `Keep-Alive: timeout=` hint minus a margin, so it
 * never writes a request into a connection the engine is closing as idle (with node:http's agent that race showed up
 * as ECONNRESET on a loaded machine).
 *
 * Invariants: a 2xx body larger than the caller's cap fails at once (declared content-length) or as soon as the
 * bytes read pass it — the request is aborted (its connection closed) and nothing more is read or kept, so no engine
 * answer can exhaust the server's memory; an error body is kept up to {@link MAX_ERROR_BODY_BYTES} and the rest
 * dropped the same way. Requests given a {@link ResponseBudget} are bounded together too: an answer's body is read
 * only once the budget has room for it (its reading paused meanwhile), and one that could never fit fails at once.
 * Failures become RolloutError('backend_error') naming the engine (timeouts, refused or
 * dropped connections, oversized answers) — refused, reset and dropped connections as its subclass
 * {@link EngineUnreachableError} —, except an abort of the caller's signal, which keeps its meaning
 * (cancelled / deadline_exceeded).
 */
export class EngineHttp {
  /** The engine's base URL without userinfo and with query values masked (see {@link withoutCredentials}): what messages and callers show. */
  readonly url: string;
  readonly label: string;
  readonly #timeoutMs: number;
  readonly #bodyIdleMs: number;
  /** The engine's origin and what its connection pools are made with (see {@link #renewConnections}). */
  readonly #origin: string;
  readonly #poolOptions: Pool.Options;
  #pool: Pool;
  /** Pools replaced by {@link #renewConnections}, closing once their requests in flight are done. */
  readonly #retired = new Set<Pool>();
  /** Path of `url` without trailing slashes, prefixed to every request's path (a gateway's `/engines/7`). */
  readonly #basePath: string;
  /**
   * The parameters of `url`'s query string as written (`key=abc`), sent with every request after its own (see
   * {@link requestTarget}).
   */
  readonly #baseQuery: readonly string[];
  /**
   * `Basic base64(user:password)` from the URL's userinfo, sent with every request unless the request gives its own
   * authorization header (an explicit key wins over the URL's).
   */
  readonly #authorization: string | undefined;

  /**
   * Throws invalid_argument (field url) for a URL an HTTP engine cannot be reached at (not a URL, not http(s)) or that
   * names no engine's base (see {@link engineUrlProblem}).
   */
  constructor(options: EngineHttpOptions) {
    let parsed: URL;
    try {
      parsed = new URL(options.url);
    } catch {
      throw RolloutError.invalid('url', `not a URL: "${withoutCredentials(options.url)}"`);
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
      throw RolloutError.invalid('url', `${options.label} engines are reached over http: or https:, not ${parsed.protocol} ("${withoutCredentials(options.url)}")`);
    }
    const problem = engineUrlProblem(options.url);
    if (problem !== undefined) throw RolloutError.invalid('url', `${problem} ("${withoutCredentials(options.url)}")`);
    this.url = withoutCredentials(options.url).replace(/\/+$/, '');
    this.#basePath = parsed.pathname.replace(/\/+$/, '');
    this.#baseQuery = parsed.search.slice(1).split('&').filter((part) => part !== '');
    this.#authorization =
      parsed.username === '' && parsed.password === ''
        ? undefined
        : `Basic ${Buffer.from(`${decodeUserinfo(parsed.username)}:${decodeUserinfo(parsed.password)}`).toString('base64')}`;
    this.label = options.label;
    this.#timeoutMs = options.requestTimeoutMs ?? 0;
    this.#bodyIdleMs = options.bodyIdleTimeoutMs ?? DEFAULT_BODY_IDLE_MS;
    this.#origin = parsed.origin;
    this.#poolOptions = {
      connections: options.maxSockets ?? 1024,
      pipelining: 1,
      // The request's whole budget is ours (`requestTimeoutMs`); undici's own 300 s header/body timeouts would cut
      // long generations short.
      headersTimeout: 0,
      bodyTimeout: 0,
    };
    try {
      this.#pool = new Pool(this.#origin, this.#poolOptions);
    } catch (err) {
      // undici refuses what it cannot connect to (its InvalidArgumentError): a mistake in the URL, never a stack trace.
      throw new RolloutError('invalid_argument', `url: ${options.label} engine URL "${this.url}" is not usable: ${err instanceof Error ? err.message : String(err)}`, { field: 'url', cause: err });
    }
  }

  /** Closes the engine's connections (when the backend is removed); requests in flight fail. */
  close(): void {
    this.#pool.destroy().catch(() => undefined);
    for (const pool of this.#retired) pool.destroy().catch(() => undefined);
    this.#retired.clear();
  }

  /**
   * Sends every later request on new connections, and closes the present ones as their requests in flight end (none
   * is cut): after an answer refused once undici had taken it as complete and kept its connection for reuse (a chunked
   * answer, see {@link exchange}), where aborting the request no longer closes anything. undici's dispatch API does not
   * say which connection an answer came on, so all of the engine's go; a refused answer is a rare fault (a proxy mixing
   * answers up), and its connections are worth less than the next request's answer.
   */
  #renewConnections(): void {
    const old = this.#pool;
    this.#pool = new Pool(this.#origin, this.#poolOptions);
    this.#retired.add(old);
    void old
      .close()
      .catch(() => undefined)
      .finally(() => this.#retired.delete(old));
  }

  /**
   * One exchange; `body` is sent as JSON when given. A body in pieces (a 64K-token prompt kept serialized by the
   * ledger, prompt-json.ts) is written into one buffer of its exact size: one copy, no joined string — unless a piece
   * is bytes of {@link MIN_UNCOPIED_PIECE_BYTES} or more (a long prompt's JSON from its token thread): the pieces are
   * then written to the socket one after another, those bytes as they are, with a content-length (see
   * {@link bodyChunks}). See the class for the bounds. `options.pausedMs`: the engine's time paused, which the
   * request budget does not count (see GenerateRequest.pausedMs). `options.budget`: the bytes of answers buffered at
   * once that this answer shares with others (see {@link ResponseBudget}): its body is read only once it has room.
   */
  request(
    method: 'GET' | 'POST',
    path: string,
    body: string | readonly JsonPiece[] | undefined,
    signal: AbortSignal,
    cap: number,
    options: { headers?: Record<string, string>; pausedMs?: (() => number) | undefined; budget?: ResponseBudget | undefined } = {},
  ): Promise<HttpAnswer> {
    return this.exchange(method, path, body, signal, cap, options, (answer) => answer);
  }

  /**
   * {@link request}, the answer read by `read` before the request counts as done: what `read` throws is the request's
   * error — and, for a 2xx answer of declared length, it is read as soon as its last byte came, before undici hands the
   * connection back to its pool, so a refused answer (one meant for another request, from a proxy that mixed answers
   * up: the connection may hold the next request's answer-to-be of another) closes its connection instead of leaving
   * it out of step for the next request sent there. An answer without a content-length (chunked) is read once it
   * ended, when undici has already kept its connection for the next request: refused, it has every connection to the
   * engine renewed instead (see #renewConnections; vLLM and SGLang send a content-length with every non-streamed answer).
   */
  exchange<T>(
    method: 'GET' | 'POST',
    path: string,
    body: string | readonly JsonPiece[] | undefined,
    signal: AbortSignal,
    cap: number,
    options: { headers?: Record<string, string>; pausedMs?: (() => number) | undefined; budget?: ResponseBudget | undefined },
    read: (answer: HttpAnswer) => T,
  ): Promise<T> {
    if (signal.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    const headers: Record<string, string> = { ...options.headers };
    if (this.#authorization !== undefined && !Object.keys(headers).some((name) => name.toLowerCase() === 'authorization')) {
      headers.authorization = this.#authorization;
    }
    let payload: string | Buffer | Buffer[] | null = null;
    if (body !== undefined) {
      headers['content-type'] = 'application/json';
      if (typeof body === 'string') {
        payload = body;
      } else {
        const chunks = bodyChunks(body);
        if (chunks !== undefined) headers['content-length'] = String(chunks.reduce((n, c) => n + c.length, 0));
        payload = chunks ?? joinPieces(body);
      }
    }
    return new Promise<T>((resolve, reject) => {
      const exchange = new Exchange<T>(this, method, path, cap, signal, this.#timeoutMs, options.pausedMs, options.budget, read, resolve, reject, this.#bodyIdleMs, () => this.#renewConnections());
      // An array of buffers is an iterable body (undici's docs/api/Dispatcher.md: `body` may be an Iterable; its
      // DispatchOptions typing omits it): written in order, with the content-length set above.
      const dispatchBody = payload as Dispatcher.DispatchOptions['body'];
      this.#pool.dispatch({ origin: undefined, path: requestTarget(this.#basePath, this.#baseQuery, path), method, headers, body: dispatchBody }, exchange);
    });
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

/**
 * Byte pieces this long are written to the socket as they are, not copied into the request's body buffer. A 64K-token
 * prompt's JSON is ~330 KB, sent with every turn of its trajectory: copied, each request was a fresh buffer of its
 * size, and that churn of external memory was what set off most of the server's garbage collections at 64K-token
 * contexts (V8 collects on external memory pressure: a scavenge every ~0.3 s and a full collection every ~2 s, each
 * pausing the event loop for milliseconds; bench/README.md round 15).
 */
const MIN_UNCOPIED_PIECE_BYTES = 64 * 1024;

/**
 * A body in pieces as the buffers undici writes one after another (an iterable body, sent with a content-length, so
 * not chunked): each run of text pieces joined into one buffer, each byte piece of at least
 * {@link MIN_UNCOPIED_PIECE_BYTES} a view of its own bytes (never changed: prompt-json.ts). Undefined when no piece is
 * that large: one joined buffer is then cheaper (one write).
 */
function bodyChunks(pieces: readonly JsonPiece[]): Buffer[] | undefined {
  if (!pieces.some((p) => typeof p !== 'string' && p.length >= MIN_UNCOPIED_PIECE_BYTES)) return undefined;
  const chunks: Buffer[] = [];
  let run: JsonPiece[] = [];
  const flush = (): void => {
    if (run.length > 0) chunks.push(joinPieces(run));
    run = [];
  };
  for (const piece of pieces) {
    if (typeof piece !== 'string' && piece.length >= MIN_UNCOPIED_PIECE_BYTES) {
      flush();
      chunks.push(Buffer.from(piece.buffer, piece.byteOffset, piece.length));
    } else {
      run.push(piece);
    }
  }
  flush();
  return chunks.filter((c) => c.length > 0);
}

/** `pieces` as one UTF-8 buffer of exactly their size, written piece by piece (no intermediate joined string). */
function joinPieces(pieces: readonly JsonPiece[]): Buffer {
  let size = 0;
  for (const piece of pieces) size += typeof piece === 'string' ? Buffer.byteLength(piece) : piece.length;
  const out = Buffer.allocUnsafe(size);
  let at = 0;
  for (const piece of pieces) {
    if (typeof piece === 'string') {
      at += out.write(piece, at);
    } else {
      out.set(piece, at);
      at += piece.length;
    }
  }
  return out;
}

/**
 * One request's undici handler: reads the answer within its byte cap and settles once. The caller's signal and the
 * request budget abort through the dispatch controller; an abort that comes while the request still waits for a
 * connection settles at once and aborts the request as soon as undici starts it.
 */
class Exchange<T> implements Dispatcher.DispatchHandler {
  #controller: Dispatcher.DispatchController | undefined;
  #settled = false;
  #timedOut = false;
  #timer: NodeJS.Timeout | undefined;
  /** The body-idle deadline (see EngineHttpOptions.bodyIdleTimeoutMs): when the body last moved, and its timer. */
  #lastData = 0;
  #idleTimer: NodeJS.Timeout | undefined;
  #ok = false;
  #limit = 0;
  #size = 0;
  readonly #chunks: Buffer[] = [];
  #status = 0;
  /** A 2xx answer's declared content-length, -1 when it declared none: it is read once that many bytes came. */
  #declared = -1;
  /** A busy answer's Retry-After (see HttpAnswer.retryAfterMs). */
  #retryAfterMs: number | undefined;
  /** Bytes this answer holds of its budget, and its place in the budget's queue while it waits for room. */
  #reserved = 0;
  #ticket: BudgetTicket | undefined;
  /** The budget, not the request's cap, is what bounds this answer (its cap is larger than the whole budget). */
  #limitIsBudget = false;
  readonly #onAbort = (): void => {
    this.#fail(this.signal.reason);
  };

  constructor(
    readonly http: EngineHttp,
    readonly method: string,
    readonly path: string,
    readonly cap: number,
    readonly signal: AbortSignal,
    readonly timeoutMs: number,
    readonly pausedMs: (() => number) | undefined,
    readonly budget: ResponseBudget | undefined,
    readonly read: (answer: HttpAnswer) => T,
    readonly resolve: (value: T) => void,
    readonly reject: (err: unknown) => void,
    readonly bodyIdleMs = 0,
    /** The answer was refused (`read` threw) after undici took it as complete: its connection cannot be closed alone. */
    readonly onRefusedAfterEnd: () => void = () => undefined,
  ) {
    signal.addEventListener('abort', this.#onAbort, { once: true });
    // The engine shares the budget from now until this exchange settles (see ResponseBudget's fairness).
    budget?.enter(http);
    if (timeoutMs > 0) this.#arm(timeoutMs, performance.now(), pausedMs?.() ?? 0);
  }

  /** The request budget: time the engine spent paused (pausedMs) is given back, so the timer re-arms for it. */
  #arm(delayMs: number, startedAt: number, pausedAtStart: number): void {
    this.#timer = setTimeout(() => {
      const paused = (this.pausedMs?.() ?? 0) - pausedAtStart;
      const counted = performance.now() - startedAt - paused;
      if (counted < this.timeoutMs - 1) return this.#arm(this.timeoutMs - counted, startedAt, pausedAtStart);
      this.#timedOut = true;
      this.#fail(new Error('request timeout'));
    }, delayMs);
  }

  /**
   * Fails the answer as unreachable once its body has sent nothing for `bodyIdleMs` (waiting for budget room does not
   * count: the answer is not reading then). One timer per answer, re-armed for what is left rather than per chunk.
   */
  #armIdle(delayMs: number): void {
    this.#idleTimer = setTimeout(() => {
      if (this.#settled) return;
      if (this.#ticket !== undefined) return this.#armIdle(this.bodyIdleMs);
      const quiet = performance.now() - this.#lastData;
      if (quiet < this.bodyIdleMs - 1) return this.#armIdle(this.bodyIdleMs - quiet);
      const { http, method, path } = this;
      this.#fail(new EngineUnreachableError(`${http.label} ${http.url} sent the headers of its ${method} ${path} answer (HTTP ${this.#status}), then nothing for ${this.bodyIdleMs} ms (${this.#size} bytes of body): a stalled engine or proxy`));
    }, delayMs);
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller;
    if (this.#settled) controller.abort(new Error('request no longer wanted'));
  }

  onResponseStart(controller: Dispatcher.DispatchController, statusCode: number, headers: Record<string, string | string[] | undefined>): void {
    // An informational response (103 Early Hints from a gateway, 102 Processing) precedes the answer and has no body:
    // taken as the answer's start, it reserved budget bytes that the final answer's reservation then overwrote (held
    // for good, until no answer fitted the budget and every request waited for room that never came).
    if (this.#settled || statusCode < 200) return;
    this.#status = statusCode;
    this.#ok = statusCode >= 200 && statusCode < 300;
    if (statusCode === 429 || statusCode === 503) this.#retryAfterMs = parseRetryAfterMs(headers['retry-after']);
    if (this.bodyIdleMs > 0 && this.#idleTimer === undefined) {
      this.#lastData = performance.now();
      this.#armIdle(this.bodyIdleMs);
    }
    this.#limit = this.#ok ? this.cap : Math.min(this.cap, MAX_ERROR_BODY_BYTES);
    const declared = headers['content-length'] === undefined ? NaN : Number(headers['content-length']);
    const known = Number.isSafeInteger(declared) && declared >= 0;
    if (this.#ok && known && declared > this.#limit) return this.#tooLarge(declared, true);
    if (this.#ok && known) this.#declared = declared;
    if (this.budget !== undefined) this.#reserve(controller, known ? Math.min(declared, this.#limit) : this.#limit, known);
  }

  /**
   * Takes `bytes` of the budget before the body is read (see {@link ResponseBudget}); without room, reading pauses
   * until the budget grants it. An answer declared larger than the whole budget fails now; one of unknown length whose
   * cap is larger is bounded by the whole budget instead.
   */
  #reserve(controller: Dispatcher.DispatchController, bytes: number, known: boolean): void {
    const budget = this.budget!;
    if (bytes === 0) return;
    if (bytes > budget.maxBytes) {
      if (known && this.#ok) return this.#fail(tooLargeForBudget(`${this.http.label} ${this.http.url}`, `${this.method} ${this.path}`, budget, `content-length ${bytes}`));
      bytes = budget.maxBytes;
      this.#limit = bytes;
      this.#limitIsBudget = true;
    }
    const reservation = budget.reserve(bytes, () => {
      this.#ticket = undefined;
      this.#reserved = bytes;
      this.#lastData = performance.now(); // the wait for room is not the engine's silence
      // Resumed from another answer's release: not inside its handler (undici may deliver this body at once).
      queueMicrotask(() => {
        if (!this.#settled) controller.resume();
      });
    }, this.http);
    if (reservation.granted) {
      this.#reserved = bytes;
    } else {
      this.#ticket = reservation.ticket;
      controller.pause();
    }
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.#settled) return;
    this.#lastData = performance.now();
    if (this.#size + chunk.length <= this.#limit) {
      this.#chunks.push(chunk);
      this.#size += chunk.length;
      // The whole body came: read it while the request is still open (see EngineHttp.exchange).
      if (this.#size === this.#declared) this.#finish();
    } else if (this.#ok) {
      this.#tooLarge(this.#size + chunk.length, false);
    } else {
      this.#chunks.push(chunk.subarray(0, this.#limit - this.#size));
      this.#size = this.#limit;
      this.#finish();
      this.#controller?.abort(new Error('error body past its cap'));
    }
  }

  onResponseEnd(): void {
    if (!this.#settled) this.#finish(true);
  }

  onResponseError(_controller: Dispatcher.DispatchController, err: Error): void {
    this.#fail(err);
  }

  /**
   * Reads the answer and settles with what `read` makes of it, or fails with what it throws — which aborts the request:
   * before undici saw the answer end (a 2xx body of declared length, see onResponseData), that closes its connection.
   */
  #finish(ended = false): void {
    const text = this.#chunks.length === 1 ? (this.#chunks[0] as Buffer).toString('utf8') : Buffer.concat(this.#chunks, this.#size).toString('utf8');
    let value: T;
    try {
      value = this.read({ status: this.#status, text, ...(this.#retryAfterMs !== undefined && { retryAfterMs: this.#retryAfterMs }) });
    } catch (err) {
      // The reader's own error, as thrown (never an unreachable engine: the answer came).
      this.#settle();
      this.#controller?.abort(err instanceof Error ? err : new Error(String(err)));
      // undici took the answer as complete (a chunked body's end): the abort closed nothing, its connection is kept. As
      // for a 2xx answer of declared length (closed by the abort), a refused 2xx one must not leave it; an error status
      // the reader turns into an error (a 400, a busy 503) is no fault of the connection.
      if (ended && this.#ok) this.onRefusedAfterEnd();
      return this.reject(err);
    }
    this.#settle();
    this.resolve(value);
  }

  #tooLarge(seen: number, declared: boolean): void {
    const { http, method, path } = this;
    if (this.#limitIsBudget) return this.#fail(tooLargeForBudget(`${http.label} ${http.url}`, `${method} ${path}`, this.budget!, `stopped reading at ${seen} bytes`));
    this.#fail(
      new RolloutError(
        'backend_error',
        `${http.label} ${http.url} sent a ${method} ${path} answer larger than the ${this.#limit}-byte cap ` +
          `(${declared ? `content-length ${seen}` : `stopped reading at ${seen} bytes`})`,
      ),
    );
  }

  /** Settles with the error the caller should see (see {@link EngineHttp}) and aborts the request if it is still on. */
  #fail(err: unknown): void {
    if (this.#settled) return;
    this.#settle();
    this.#controller?.abort(err instanceof Error ? err : new Error(String(err)));
    const { http } = this;
    if (this.signal.aborted) this.reject(RolloutError.from(this.signal.reason, 'cancelled'));
    else if (err instanceof RolloutError) this.reject(err);
    else if (this.#timedOut) {
      this.reject(new RolloutError('backend_error', `${http.label} ${http.url} did not answer within ${this.timeoutMs} ms`, { cause: err }));
    } else this.reject(new EngineUnreachableError(`${http.label} ${http.url} unreachable: ${describe(err)}`, { cause: err }));
  }

  #settle(): void {
    this.#settled = true;
    clearTimeout(this.#timer);
    clearTimeout(this.#idleTimer);
    this.signal.removeEventListener('abort', this.#onAbort);
    this.#ticket?.cancel();
    this.#ticket = undefined;
    // Its bytes are handed over (text) or dropped: the room goes back to answers waiting for it.
    if (this.#reserved > 0) this.budget?.release(this.#reserved, this.http);
    this.#reserved = 0;
    this.budget?.leave(this.http);
    this.#chunks.length = 0;
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
 * The engine answered GET /v1/models without the model the backend is to serve: every request naming it would be
 * refused (vLLM answers 404 "The model `x` does not exist"). invalid_argument naming `model` (AddBackend's field; the
 * start-up names `backends[i].model`), with the ids the engine does serve. The pool keeps such a backend out of
 * routing (see BackendPool.checkEngineAgrees).
 */
export class ModelNotServedError extends RolloutError {
  constructor(
    /** What is wrong, without the field: `vLLM http://… does not serve "policy" (it serves "other")`. */
    readonly reason: string,
  ) {
    super('invalid_argument', `model: ${reason}`, { field: 'model' });
    this.name = 'ModelNotServedError';
  }
}

/** At most this many served ids are listed in a {@link ModelNotServedError}, each cut to 80 characters. */
const MAX_LISTED_MODELS = 8;

/**
 * The `max_model_len` of `model`'s card in an OpenAI-style GET /v1/models answer (vLLM and SGLang both serve one):
 * the card whose id is the model — or, unless `exact`, the only card when the engine serves one under another name
 * (SGLang's /generate takes no model name, so its card's name does not matter; vLLM refuses every request naming a
 * model it does not serve, so its client asks `exact`). Undefined when the card states no usable length;
 * one past {@link MAX_ENGINE_LIMIT} is read as that; {@link ModelNotServedError} when the engine lists no such card; backend_error when it answers an error or not JSON
 * (an engine that cannot say is asked again later: that is no answer about its model).
 */
export async function modelCardMaxLen(http: EngineHttp, engine: string, model: string, signal: AbortSignal, options: { exact?: boolean } = {}): Promise<number | undefined> {
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
  const card = cards.find((c) => c.id === model) ?? (cards.length === 1 && options.exact !== true ? cards[0] : undefined);
  if (card === undefined) {
    const ids = cards.map((c) => (typeof c.id === 'string' ? JSON.stringify(c.id.length > 80 ? `${c.id.slice(0, 80)}…` : c.id) : '(no id)'));
    const listed = ids.length === 0 ? 'it lists none' : `it serves ${ids.slice(0, MAX_LISTED_MODELS).join(', ')}${ids.length > MAX_LISTED_MODELS ? ` and ${ids.length - MAX_LISTED_MODELS} more` : ''}`;
    throw new ModelNotServedError(`${engine} does not serve model ${JSON.stringify(model)} (GET /v1/models: ${listed})`);
  }
  return engineLimit(card.max_model_len);
}
