import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { statusName } from '../pipeline/outcome.js';
import type { Logger } from './logger.js';
import { RateLimitedLog, type RateLimitOptions } from './rate-limited-log.js';

/** Rate of the failure log (see RateLimitedLog): default 10 lines per second after a burst of 20. */
export type FailureLogOptions = RateLimitOptions;

const NOT_FAILED = new Set([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED]);

/**
 * One structured log line per failed trajectory — task, sample, status, backend of its last turn, cause — so an
 * operator sees why samples fail without asking the trainer. Bounded: when engines fail by the thousand, a token
 * bucket lets `burst` lines through and then `linesPerSecond`; lines it drops are counted and the count rides on
 * the next line written (`suppressed`). COMPLETED and TRUNCATED trajectories are not failures and are ignored;
 * CANCELLED is logged at info (the client asked for it), every other status at warn.
 *
 * @example
 * const failures = new FailureLog(logger.child({ component: 'pipeline' }));
 * failures.record(trajectory); // after it is built, before it is delivered
 */
export class FailureLog {
  readonly #lines: RateLimitedLog;

  constructor(logger: Logger, options: FailureLogOptions = {}) {
    this.#lines = new RateLimitedLog(logger, options);
  }

  /** Lines dropped since the last line written. */
  get suppressed(): number {
    return this.#lines.suppressed;
  }

  /** Logs the trajectory if it failed and the rate allows; otherwise counts it as suppressed. */
  record(trajectory: Trajectory): void {
    if (NOT_FAILED.has(trajectory.status)) return;
    const line = (): object => {
      const backend = trajectory.turns.findLast((t) => t.backend !== '')?.backend;
      return {
        task: trajectory.taskId,
        sample: trajectory.sampleIndex,
        environment: trajectory.environment,
        status: statusName(trajectory.status),
        finishReason: trajectory.finishReason,
        ...(backend !== undefined && { backend }),
        cause: trajectory.error,
      };
    };
    this.#lines.write(trajectory.status === TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED ? 'info' : 'warn', line, 'trajectory failed');
  }
}
