import { describe, expect, it } from 'vitest';
import { DEFAULT_RETRY_REJECTED_FOR_MS, RETRY_CAP_MS, RETRY_FIRST_MS, RetrySchedule, retryBudgetOf } from '../../src/client/refusal-retry.js';

/** The waits a schedule grants on a clock that advances by each wait (every retry refused again at once). */
function waits(budgetMs: number): number[] {
  let now = 1_000;
  const schedule = new RetrySchedule(budgetMs, () => now);
  const out: number[] = [];
  for (let d = schedule.next(); d !== undefined; d = schedule.next()) {
    out.push(d);
    now += d;
  }
  return out;
}

describe('the retry schedule of a refused submit', () => {
  it('backs off from 50 ms, doubling to a 2 s cap, as the Python client does', () => {
    expect([RETRY_FIRST_MS, RETRY_CAP_MS, DEFAULT_RETRY_REJECTED_FOR_MS]).toEqual([50, 2_000, 60_000]);
    expect(waits(10_000)).toEqual([50, 100, 200, 400, 800, 1_600, 2_000, 2_000, 2_000]);
  });

  it('never grants a wait that ends past the budget, so the submit fails within it; 0 grants none', () => {
    for (const budget of [0, 49, 50, 149, 150, 1_500, 60_000]) {
      const granted = waits(budget);
      expect(granted.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(budget);
    }
    expect(waits(0)).toEqual([]);
    expect(waits(1_500)).toEqual([50, 100, 200, 400]); // the next (800 ms) would end at 1 550 ms
    // Over a minute of refusals: about one submit every 2 s, never a spin.
    expect(waits(60_000).length).toBeLessThan(40);
  });

  it('checks the option: a negative or NaN budget is refused; undefined is the default; Infinity is allowed', () => {
    expect(retryBudgetOf(undefined)).toBe(60_000);
    expect(retryBudgetOf(0)).toBe(0);
    expect(retryBudgetOf(Infinity)).toBe(Infinity);
    expect(() => retryBudgetOf(-1)).toThrow(/retryRejectedForMs/);
    expect(() => retryBudgetOf(Number.NaN)).toThrow(/retryRejectedForMs/);
  });
});
