/**
 * The one error type of the project. Every failure that crosses a module boundary is a RolloutError with a
 * code; the contract layer maps codes to gRPC statuses in exactly one place (src/contract/status.ts) and the
 * pipeline maps them to trajectory statuses (src/pipeline/outcome.ts). Unknown errors become `internal`.
 */
export type ErrorCode =
  | 'invalid_argument'
  | 'not_found'
  | 'already_exists'
  | 'resource_exhausted'
  | 'failed_precondition'
  | 'unavailable'
  | 'deadline_exceeded'
  | 'cancelled'
  /** Superseded: e.g. a stream whose session another stream took over. */
  | 'aborted'
  | 'unauthenticated'
  | 'internal'
  /** The sandbox could not be started or died under us (infrastructure, not the model's fault). */
  | 'sandbox_error'
  /** The LLM engine failed or no engine could be reached (infrastructure). */
  | 'backend_error'
  /** The environment's own code failed in setup or evaluation (infrastructure). */
  | 'environment_error';

export interface RolloutErrorOptions {
  cause?: unknown;
  /** For invalid_argument: the path of the offending field, e.g. "instance.answer". */
  field?: string;
}

export class RolloutError extends Error {
  readonly code: ErrorCode;
  readonly field: string | undefined;

  constructor(code: ErrorCode, message: string, options: RolloutErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'RolloutError';
    this.code = code;
    this.field = options.field;
  }

  /** Wraps anything thrown. AbortSignal reasons keep their meaning (deadline vs cancel). */
  static from(err: unknown, fallback: ErrorCode = 'internal'): RolloutError {
    if (err instanceof RolloutError) return err;
    if (err instanceof Error && (err.name === 'TimeoutError' || err.name === 'AbortError')) {
      return new RolloutError(err.name === 'TimeoutError' ? 'deadline_exceeded' : 'cancelled', err.message, { cause: err });
    }
    const message = err instanceof Error ? err.message : String(err);
    return new RolloutError(fallback, message, { cause: err });
  }

  static invalid(field: string, reason: string): RolloutError {
    return new RolloutError('invalid_argument', `${field}: ${reason}`, { field });
  }
}

/**
 * What a stage's (or a tool's) own code threw, classified against the signal that code was given: the signal's
 * reason when it fired (timeout or cancel), a RolloutError as it is, anything else as `fallback` — including an
 * AbortError or TimeoutError the code raised itself (a grader call with its own deadline): nobody cancelled the
 * sample and its deadline did not pass, so it is that code's failure, not TIMEOUT or CANCELLED.
 */
export function classifyThrown(err: unknown, fallback: ErrorCode, signal: AbortSignal | undefined): RolloutError {
  if (signal?.aborted) return RolloutError.from(signal.reason, 'cancelled');
  if (err instanceof RolloutError) return err;
  if (err instanceof Error && (err.name === 'TimeoutError' || err.name === 'AbortError')) {
    return new RolloutError(fallback, `${err.name}: ${err.message}`, { cause: err });
  }
  return RolloutError.from(err, fallback);
}

/** Throws the signal's reason as a RolloutError if it has fired. */
export function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw RolloutError.from(signal.reason, 'cancelled');
}

/** An abort reason that says why: deadline_exceeded for timeouts, cancelled otherwise. */
export function abortReason(code: 'deadline_exceeded' | 'cancelled', message: string): RolloutError {
  return new RolloutError(code, message);
}

/** Bound of a failure's text in Trajectory.error and failure logs: enough for an engine's error body. */
export const MAX_ERROR_TEXT_BYTES = 2048;

/**
 * The whole story of a failure in one bounded line: "<code>: <message>: <cause's message>: ..." walking the
 * `cause` chain (at most 8 links, cycles cut), skipping a cause whose text is already said — e.g.
 * "backend_error: vLLM http://gpu-3:8000 answered HTTP 400: {"error":{"message":"..."}}". At most `maxBytes`
 * bytes of UTF-8, cut at a code point (never inside a surrogate pair) and marked with "…"; lone surrogates
 * become U+FFFD, so the text is valid UTF-8 for protobuf and JSON logs.
 */
export function describeError(err: unknown, maxBytes = MAX_ERROR_TEXT_BYTES): string {
  const parts: string[] = [];
  const seen = new Set<unknown>();
  let current: unknown = err;
  for (let depth = 0; current !== undefined && current !== null && depth < 8 && !seen.has(current); depth++) {
    seen.add(current);
    const text = depth === 0 && current instanceof RolloutError ? `${current.code}: ${current.message}` : messageOf(current);
    if (text !== '' && !parts.some((p) => p.includes(text))) parts.push(text);
    current = typeof current === 'object' ? (current as { cause?: unknown }).cause : undefined;
  }
  return truncateUtf8(wellFormed(parts.join(': ')), maxBytes);
}

function messageOf(value: unknown): string {
  if (value instanceof Error) {
    const code = (value as { code?: unknown }).code;
    return value.message || (typeof code === 'string' ? code : value.name);
  }
  return typeof value === 'string' || typeof value === 'number' || typeof value === 'boolean' ? String(value) : '';
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** `text` with each lone surrogate (which UTF-8 cannot carry) replaced by U+FFFD. */
export function wellFormed(text: string): string {
  return text.replace(LONE_SURROGATE, '\uFFFD');
}

/** Whether `text` holds a lone surrogate (String.prototype.isWellFormed, which the ES2023 lib does not declare). */
export function hasLoneSurrogate(text: string): boolean {
  LONE_SURROGATE.lastIndex = 0;
  return LONE_SURROGATE.test(text);
}

/** `text` if it fits in `maxBytes` of UTF-8, else its longest code-point prefix that fits with a trailing "…". */
function truncateUtf8(text: string, maxBytes: number): string {
  if (text.length <= maxBytes / 3 || Buffer.byteLength(text) <= maxBytes) return text;
  const room = maxBytes - 3; // "…" is 3 bytes
  let bytes = 0;
  let end = 0;
  for (const ch of text) {
    const size = Buffer.byteLength(ch);
    if (bytes + size > room) break;
    bytes += size;
    end += ch.length;
  }
  return `${text.slice(0, end)}…`;
}

/**
 * `text` cut to `max` UTF-16 units, then marked (`marker`, default "..."), never inside a surrogate pair: what an
 * answer echoes of a request (a field path holding a Struct key the client chose, a reason quoting a value) must not
 * outgrow the message or trailer it goes in, nor a report what the policy wrote.
 */
export function clipped(text: string, max: number, marker = '...'): string {
  if (text.length <= max) return text;
  const end = /[\uD800-\uDBFF]/.test(text[max - 1]!) ? max - 1 : max;
  return `${text.slice(0, end)}${marker}`;
}
