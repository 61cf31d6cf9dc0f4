import { Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { RolloutError, type ErrorCode } from '../errors.js';
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
  if (err.field) metadata.set('rollout-field', err.field);
  return { code: GRPC_CODE[err.code], details: err.message, metadata };
}
