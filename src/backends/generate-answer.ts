import { RolloutError } from '../errors.js';
import { AnswerMisdelivered, CompletionRejected, isRecord, type CompletionExpectation } from './completion.js';
import { ContextOverflowError, overflowMismatch, type ContextOverflowClaim } from './context-overflow.js';
import { EngineHttpError, type HttpAnswer } from './engine-http.js';
import type { GenerateRequest, GenerateResult } from './types.js';

/**
 * A generate request the engine (or a gateway in front of it) refused for now, nothing sampled: HTTP 429 (too many
 * requests) or 503 (service unavailable), what a bounded waiting queue answers when it is full (vLLM's
 * --max-waiting-queue-length proposals, SGLang and gateways such as Envoy). The lease asks again after a backoff
 * (see BackendPoolOptions.maxBusyRetries) — no sooner than its Retry-After, when it sent one (`retryAfterMs`, bounded by
 * BackendPoolOptions.maxRetryAfterMs); a backend_error like any other once those run out.
 */
export class EngineBusyError extends RolloutError {
  constructor(
    message: string,
    cause: EngineHttpError,
    /** The answer's Retry-After in ms, when it had one (see parseRetryAfterMs). */
    readonly retryAfterMs?: number,
  ) {
    super('backend_error', message, { cause });
    this.name = 'EngineBusyError';
  }
}

/**
 * A 2xx answer that answers another request (see {@link AnswerMisdelivered}: another prompt length or request id) — a
 * gateway or proxy mixing answers up, or a keep-alive connection out of step. Nothing of it enters a trajectory; the
 * connection it came on is discarded (EngineHttp.exchange), and the pool counts it on the backend and asks again, on
 * another engine when there is one (BackendPool, PoolLease), bounded like a lost backend.
 */
export class EngineMisdeliveredError extends RolloutError {
  constructor(message: string) {
    super('backend_error', message);
    this.name = 'EngineMisdeliveredError';
  }
}

/** What reading an answer needs of its request: the prompt, max_tokens, the vocabulary bound and the id it was sent with. */
export type AnsweredRequest = Pick<GenerateRequest, 'promptIds' | 'maxTokens' | 'vocabSize' | 'requestId'>;

/** How one engine kind's generate answer is read: its name in messages, its overflow refusal and its answer check. */
export interface GenerateAnswerKind {
  /** The engine's name in error messages ("vLLM", "SGLang"). */
  engine: string;
  /** What a body that fails the check is called in its error ("completion", "answer"). */
  noun: string;
  /** Recognises the engine's context-length refusal among non-2xx answers; undefined for anything else. */
  overflow: (status: number, text: string, request: AnsweredRequest) => ContextOverflowClaim | undefined;
  /** Checks a parsed body and copies out the result; throws {@link CompletionRejected} for what it refuses. */
  check: (json: unknown, expect: CompletionExpectation) => GenerateResult;
}

/**
 * One generate request's HTTP answer, read the same way for every engine kind: a context-length refusal is a
 * {@link ContextOverflowError} (the policy ran out of room, not the engine failing) when this request can have caused
 * it (see {@link overflowMismatch}; one it cannot have is backend_error saying why), any other non-2xx answer is
 * backend_error with the status and body as its cause, and a 2xx body that is not JSON or fails the kind's check
 * is backend_error "sent a malformed <noun>" — or, when it is an error object (a gateway or engine answering 200 for
 * a failure), backend_error quoting its message, the body as its cause. The body is bounded by the caller's byte cap,
 * so parsing is bounded too (V8's JSON.parse is iterative: no stack overflow on deep nesting); the check copies out
 * only checked values.
 */
export function readGenerateAnswer(
  kind: GenerateAnswerKind,
  url: string,
  answer: HttpAnswer,
  request: AnsweredRequest,
): GenerateResult {
  const { status, text } = answer;
  if (status < 200 || status >= 300) {
    const cause = new EngineHttpError(status, text);
    const overflow = kind.overflow(status, text, request);
    const mismatch = overflow && overflowMismatch(overflow, request.promptIds.length, request.maxTokens);
    if (mismatch !== undefined) {
      throw new RolloutError('backend_error', `${kind.engine} ${url} answered HTTP ${status}, a context-length refusal this request cannot have caused: ${mismatch}`, { cause });
    }
    if (overflow) {
      throw new ContextOverflowError(
        overflow.maxModelLen,
        overflow.promptTokens,
        `${kind.engine} ${url}: ${request.promptIds.length} context + ${request.maxTokens} max_tokens exceed max_model_len ${overflow.maxModelLen}`,
        cause,
      );
    }
    if (status === 429 || status === 503) {
      const hint = answer.retryAfterMs === undefined ? '' : `, Retry-After ${Math.ceil(answer.retryAfterMs / 1000)} s`;
      throw new EngineBusyError(`${kind.engine} ${url} answered HTTP ${status} (busy${hint})`, cause, answer.retryAfterMs);
    }
    throw new RolloutError('backend_error', `${kind.engine} ${url} answered HTTP ${status}`, { cause });
  }
  const malformed = (what: string, cause?: unknown): RolloutError =>
    new RolloutError('backend_error', `${kind.engine} ${url} sent a malformed ${kind.noun}: ${what}`, { cause });
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw malformed('body is not JSON', err);
  }
  const engineError = errorObjectMessage(json);
  if (engineError !== undefined) {
    throw new RolloutError('backend_error', `${kind.engine} ${url} answered HTTP ${status} with an error: ${engineError}`, { cause: new EngineHttpError(status, text) });
  }
  try {
    return kind.check(json, {
      maxTokens: request.maxTokens,
      promptIds: request.promptIds,
      ...(request.vocabSize !== undefined && { vocabSize: request.vocabSize }),
      ...(request.requestId !== undefined && { requestId: request.requestId }),
    });
  } catch (err) {
    if (err instanceof AnswerMisdelivered) throw new EngineMisdeliveredError(malformed(err.reason).message);
    if (err instanceof CompletionRejected) throw malformed(err.reason);
    throw err;
  }
}

/** The longest part of an engine's error message quoted in a backend_error (the whole body stays in its cause). */
const MAX_QUOTED_ERROR_CHARS = 500;

/**
 * The message of a 2xx body that is an error object rather than an answer — `{"error": "..."}`, `{"error": {"message":
 * "..."}}` (OpenAI's shape, SGLang's) or vLLM's flat `{"object": "error", "message": "..."}` — cut to
 * {@link MAX_QUOTED_ERROR_CHARS}; undefined for anything else. No answer of either engine has an `error` field.
 */
function errorObjectMessage(json: unknown): string | undefined {
  if (!isRecord(json)) return undefined;
  let message: unknown;
  if (json.object === 'error') message = json.message;
  else if (json.error !== undefined && json.error !== null) message = isRecord(json.error) ? json.error.message : json.error;
  else return undefined;
  const text = typeof message === 'string' && message.trim() !== '' ? message.trim() : '(no message)';
  return text.length > MAX_QUOTED_ERROR_CHARS ? `${text.slice(0, MAX_QUOTED_ERROR_CHARS)}…` : text;
}
