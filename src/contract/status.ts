import { Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { clipped, RolloutError, wellFormed, type ErrorCode } from '../errors.js';
import type { Logger } from '../observability/logger.js';

const GRPC_CODE: Record<ErrorCode, status> = {
  invalid_argument: status.INVALID_ARGUMENT,
  not_found: status.NOT_FOUND,
  already_exists: status.ALREADY_EXISTS,
  resource_exhausted: status.RESOURCE_EXHAUSTED,
  failed_precondition: status.FAILED_PRECONDITION,
  unavailable: status.UNAVAILABLE,
  deadline_exceeded: status.DEADLINE_EXCEEDED,
  cancelled: status.CANCELLED,
  aborted: status.ABORTED,
  unauthenticated: status.UNAUTHENTICATED,
  internal: status.INTERNAL,
  sandbox_error: status.UNAVAILABLE,
  backend_error: status.UNAVAILABLE,
  environment_error: status.INTERNAL,
};

/** The gRPC status code of an error (INTERNAL for anything not a RolloutError): also TaskRejected.code. */
export function grpcCodeOf(err: unknown): status {
  return err instanceof RolloutError ? GRPC_CODE[err.code] : status.INTERNAL;
}

/**
 * The one place where errors become gRPC statuses. Known errors keep their message (and the field, as the
 * `rollout-field` trailer); unknown errors become INTERNAL with a generic message, the cause going to the log.
 */
export function toServiceError(err: unknown, log: Logger): Partial<ServiceError> {
  if (!(err instanceof RolloutError) || err.code === 'internal') {
    log.error({ err }, 'internal error');
    return { code: status.INTERNAL, details: 'internal error' };
  }
  const metadata = new Metadata();
  if (err.field) metadata.set('rollout-field', headerSafeField(err.field));
  return { code: GRPC_CODE[err.code], details: boundedDetails(err.message), metadata };
}

/**
 * The most bytes a status message takes percent-encoded (grpc-js sends it as the grpc-message trailer). A message that
 * quotes what a client sent (an unknown 40 KB task id) would otherwise make a trailer over the client's header list
 * limit (8–64 KiB by implementation): the call is then left without a status until its deadline.
 */
const MAX_DETAILS_ENCODED = 4096;
/** Longest field path answered (a path may hold a client's key); longer ones are cut, marked "...". */
export const MAX_FIELD_CHARS = 256;
/** What encodeURI leaves as it is (one byte each); anything else is %XX per UTF-8 byte. */
const URI_SAFE = /[A-Za-z0-9;,/?:@&=+$\-_.!~*'()#]/;

/** `message` cut (with "…") to at most MAX_DETAILS_ENCODED bytes once percent-encoded, at a code point. */
function boundedDetails(message: string): string {
  // encodeURI throws on a lone surrogate, and so would grpc-js sending it.
  // Cut first (a message may quote megabytes); past 8192 units it is over the bound anyway.
  const text = wellFormed(message.length > 8192 ? message.slice(0, 8192) : message);
  // A UTF-16 unit is at most 9 bytes percent-encoded (a surrogate pair 12 for its two).
  if (text.length * 9 <= MAX_DETAILS_ENCODED) return text;
  let encoded = 0;
  let end = 0;
  for (const c of text) {
    const size = URI_SAFE.test(c) ? 1 : 3 * Buffer.byteLength(c);
    if (encoded + size > MAX_DETAILS_ENCODED - 9) return `${text.slice(0, end)}…`; // "…" is 9 bytes encoded
    encoded += size;
    end += c.length;
  }
  return text;
}

/**
 * A field path as a header value: metadata values are printable ASCII (grpc-js throws on anything else, leaving the
 * call without a status), and a path may hold a map or Struct key the client chose. Other characters are written as
 * JSON-style \uXXXX escapes; bounded like a field name.
 */
function headerSafeField(field: string): string {
  return clipped(field, MAX_FIELD_CHARS).replace(/[^\x20-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}
