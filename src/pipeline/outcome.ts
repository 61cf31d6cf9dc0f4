import type { ErrorCode, RolloutError } from '../errors.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';

/**
 * Maps a failure to the trajectory status the trainer filters on. This is the one place where infrastructure
 * failures become statuses: they are never reported as COMPLETED with reward 0.
 */
export function statusForError(err: RolloutError): TrajectoryStatus {
  return STATUS_BY_CODE[err.code];
}

const STATUS_BY_CODE: Record<ErrorCode, TrajectoryStatus> = {
  invalid_argument: TrajectoryStatus.TRAJECTORY_STATUS_INVALID_TASK,
  not_found: TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR,
  already_exists: TrajectoryStatus.TRAJECTORY_STATUS_INVALID_TASK,
  resource_exhausted: TrajectoryStatus.TRAJECTORY_STATUS_SANDBOX_ERROR,
  failed_precondition: TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR,
  unavailable: TrajectoryStatus.TRAJECTORY_STATUS_BACKEND_ERROR,
  deadline_exceeded: TrajectoryStatus.TRAJECTORY_STATUS_TIMEOUT,
  cancelled: TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED,
  aborted: TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED,
  unauthenticated: TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR,
  internal: TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR,
  sandbox_error: TrajectoryStatus.TRAJECTORY_STATUS_SANDBOX_ERROR,
  backend_error: TrajectoryStatus.TRAJECTORY_STATUS_BACKEND_ERROR,
  environment_error: TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR,
};

/** A status as people read it: its enum name without the prefix ("COMPLETED", "BACKEND_ERROR"); a number unknown to this build as itself. */
export function statusName(status: TrajectoryStatus): string {
  return TrajectoryStatus[status]?.replace('TRAJECTORY_STATUS_', '') ?? String(status);
}

/** finish_reason recorded for a failure. */
export function finishReasonForError(err: RolloutError): string {
  switch (err.code) {
    case 'deadline_exceeded':
      return 'timeout';
    case 'cancelled':
      return 'cancelled';
    default:
      return 'error';
  }
}
