import { RolloutError } from './errors.js';

/**
 * The longest a Node timer can wait, ms (2^31 - 1, about 24.8 days): Node fires a longer delay after 1 ms instead
 * (with a TimeoutOverflowWarning), so a timeout configured above it would end its work at once. Configured timeouts
 * are bounded by it where they are read; delays that come from outside at run time (a client's call deadline) go
 * through setLongTimeout.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** A configured timer's length, checked: a whole number of ms from 0 to MAX_TIMER_MS, else invalid_argument naming `name`. */
export function timerOption(name: string, ms: number): number {
  if (!Number.isInteger(ms) || ms < 0 || ms > MAX_TIMER_MS) throw RolloutError.invalid(name, `must be a whole number of ms from 0 to ${MAX_TIMER_MS}, got ${ms}`);
  return ms;
}

/** A timer of setLongTimeout. */
export interface LongTimer {
  /** Stops it (idempotent); `fn` has not run and will not. */
  clear(): void;
}

/**
 * setTimeout for any delay: one above MAX_TIMER_MS is waited in steps, so it never fires early; a delay of
 * Infinity never fires. `unref` (default true) lets the process exit while it waits.
 */
export function setLongTimeout(fn: () => void, ms: number, options: { unref?: boolean } = {}): LongTimer {
  let timer: NodeJS.Timeout | undefined;
  const at = Date.now() + Math.max(0, ms);
  const arm = (): void => {
    const left = at - Date.now();
    timer = left > MAX_TIMER_MS ? setTimeout(arm, MAX_TIMER_MS) : setTimeout(fn, Math.max(0, left));
    if (options.unref ?? true) timer.unref();
  };
  if (ms !== Infinity) arm();
  return { clear: () => clearTimeout(timer) };
}
