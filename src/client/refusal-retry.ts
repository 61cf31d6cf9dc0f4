/**
 * How long a task the server refuses for now (TaskRejected.code RESOURCE_EXHAUSTED or UNAVAILABLE) is submitted again
 * by default: 60 s, the Python client's `retry_rejected_for`.
 */
export const DEFAULT_RETRY_REJECTED_FOR_MS = 60_000;

/** Backoff between the submits of a refused task: the first wait, doubled after each refusal up to the cap (as Python's). */
export const RETRY_FIRST_MS = 50;
export const RETRY_CAP_MS = 2_000;

/** `retryRejectedForMs` as given, checked: a non-negative number of milliseconds (Infinity: for as long as the stream lives). */
export function retryBudgetOf(ms: number | undefined): number {
  return budgetOf('retryRejectedForMs', ms, DEFAULT_RETRY_REJECTED_FOR_MS);
}

/** A budget option `name` in ms (`fallback` when absent); a RangeError naming it when it is not a non-negative number. */
export function budgetOf(name: string, ms: number | undefined, fallback: number): number {
  const value = ms ?? fallback;
  if (typeof value !== 'number' || Number.isNaN(value) || value < 0) {
    throw new RangeError(`${name}: must be a non-negative number of milliseconds, got ${String(ms)}`);
  }
  return value;
}

/**
 * The retry schedule of one submit: the budget starts at its first refusal; each refusal doubles the next wait
 * (50 ms to 2 s), so a server that keeps refusing sees a handful of submits a second at most, never a spin.
 * Invariant: a retry is granted only when its wait ends within the budget (the Python client's rule), so the
 * submit fails no later than the budget after its first refusal.
 */
export class RetrySchedule {
  private until: number | undefined;
  private nextDelayMs = RETRY_FIRST_MS;

  constructor(
    private readonly budgetMs: number,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** The wait before the next submit, or undefined when the budget does not allow one. */
  next(): number | undefined {
    const now = this.now();
    this.until ??= now + this.budgetMs;
    if (now + this.nextDelayMs > this.until) return undefined;
    const delay = this.nextDelayMs;
    this.nextDelayMs = Math.min(delay * 2, RETRY_CAP_MS);
    return delay;
  }
}
