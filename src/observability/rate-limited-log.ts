import type { Logger } from './logger.js';

/** Rate of a rate-limited log: a token bucket of `burst` lines refilled at `linesPerSecond`. */
export interface RateLimitOptions {
  /** Sustained lines per second (default 10). */
  linesPerSecond?: number;
  /** Lines that may be written at once after a quiet period (default 20). */
  burst?: number;
  /**
   * Clock in ms (tests pass a fake one). Default: a monotonic one (performance.now), not the wall clock: set back (NTP,
   * a VM restored from a snapshot) the wall clock made the refill negative, and the log silent for as long as the step.
   */
  now?: () => number;
}

/**
 * Log lines that something outside the server can cause by the thousand (failed trajectories when engines fail,
 * refused calls from an unauthenticated client) go through one of these, so the log cannot be flooded: a token
 * bucket lets `burst` lines through and then `linesPerSecond`; lines it drops are counted and the count rides on the
 * next line written (`suppressed`).
 *
 * @example
 * const refusals = new RateLimitedLog(logger.child({ component: 'auth' }));
 * refusals.write('warn', { method, peer }, 'call refused: missing or wrong bearer token');
 */
export class RateLimitedLog {
  readonly #log: Logger;
  readonly #rate: number;
  readonly #burst: number;
  readonly #now: () => number;
  #tokens: number;
  #last: number;
  #suppressed = 0;

  constructor(logger: Logger, options: RateLimitOptions = {}) {
    this.#log = logger;
    this.#rate = options.linesPerSecond ?? 10;
    this.#burst = options.burst ?? 20;
    this.#now = options.now ?? (() => performance.now());
    this.#tokens = this.#burst;
    this.#last = this.#now();
  }

  /** Lines dropped since the last line written. */
  get suppressed(): number {
    return this.#suppressed;
  }

  /**
   * Writes the line at `level` when the rate allows (with `suppressed` set when lines were dropped before it);
   * otherwise counts it. `line` is only called for a line written, so a dropped one costs no formatting.
   */
  write(level: 'info' | 'warn' | 'error', line: object | (() => object), msg: string): boolean {
    const now = this.#now();
    // Never a negative refill, whatever a given clock does.
    this.#tokens = Math.min(this.#burst, this.#tokens + (Math.max(0, now - this.#last) / 1000) * this.#rate);
    this.#last = now;
    if (this.#tokens < 1) {
      this.#suppressed++;
      return false;
    }
    this.#tokens -= 1;
    const fields = typeof line === 'function' ? line() : line;
    this.#log[level]({ ...fields, ...(this.#suppressed > 0 && { suppressed: this.#suppressed }) }, msg);
    this.#suppressed = 0;
    return true;
  }
}
