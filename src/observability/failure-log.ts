import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { Logger } from './logger.js';

/** Rate of the failure log: a token bucket of `burst` lines refilled at `linesPerSecond`. */
export interface FailureLogOptions {
  /** Sustained lines per second (default 10). */
  linesPerSecond?: number;
  /** Lines that may be written at once after a quiet period (default 20). */
  burst?: number;
  /** Clock in ms (tests pass a fake one). */
  now?: () => number;
}

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
  readonly #log: Logger;
  readonly #rate: number;
  readonly #burst: number;
  readonly #now: () => number;
  #tokens: number;
  #last: number;
  #suppressed = 0;

  constructor(logger: Logger, options: FailureLogOptions = {}) {
    this.#log = logger;
    this.#rate = options.linesPerSecond ?? 10;
    this.#burst = options.burst ?? 20;
    this.#now = options.now ?? Date.now;
    this.#tokens = this.#burst;
    this.#last = this.#now();
  }

  /** Lines dropped since the last line written. */
  get suppressed(): number {
    return this.#suppressed;
  }

  /** Logs the trajectory if it failed and the rate allows; otherwise counts it as suppressed. */
  record(trajectory: Trajectory): void {
    if (NOT_FAILED.has(trajectory.status)) return;
    const now = this.#now();
    this.#tokens = Math.min(this.#burst, this.#tokens + ((now - this.#last) / 1000) * this.#rate);
    this.#last = now;
    if (this.#tokens < 1) {
      this.#suppressed++;
      return;
    }
    this.#tokens -= 1;
    const backend = trajectory.turns.findLast((t) => t.backend !== '')?.backend;
    const line = {
      task: trajectory.taskId,
      sample: trajectory.sampleIndex,
      environment: trajectory.environment,
      status: TrajectoryStatus[trajectory.status].replace('TRAJECTORY_STATUS_', ''),
      finishReason: trajectory.finishReason,
      ...(backend !== undefined && { backend }),
      cause: trajectory.error,
      ...(this.#suppressed > 0 && { suppressed: this.#suppressed }),
    };
    this.#suppressed = 0;
    if (trajectory.status === TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED) this.#log.info(line, 'trajectory failed');
    else this.#log.warn(line, 'trajectory failed');
  }
}
