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

/** Throws the signal's reason as a RolloutError if it has fired. */
export function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw RolloutError.from(signal.reason, 'cancelled');
}

/** An abort reason that says why: deadline_exceeded for timeouts, cancelled otherwise. */
export function abortReason(code: 'deadline_exceeded' | 'cancelled', message: string): RolloutError {
  return new RolloutError(code, message);
}
