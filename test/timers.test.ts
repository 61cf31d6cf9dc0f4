import { afterEach, describe, expect, it, vi } from 'vitest';
import { MAX_TIMER_MS, setLongTimeout } from '../src/timers.js';

// Regression: Node fires a delay above 2^31 - 1 ms after 1 ms. A call whose deadline was 30 days away failed at once
// ("call deadline reached"); configured timeouts above it ended every sample or command at once.
describe('setLongTimeout', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('a delay above what a Node timer holds fires at its time, not at once', () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'] });
    const fired = vi.fn();
    const thirtyDays = 30 * 24 * 3_600_000;
    expect(thirtyDays).toBeGreaterThan(MAX_TIMER_MS);
    setLongTimeout(fired, thirtyDays);
    vi.advanceTimersByTime(MAX_TIMER_MS);
    expect(fired).not.toHaveBeenCalled();
    vi.advanceTimersByTime(thirtyDays - MAX_TIMER_MS - 1);
    expect(fired).not.toHaveBeenCalled();
    vi.advanceTimersByTime(1);
    expect(fired).toHaveBeenCalledOnce();
  });

  it('clear() stops it in any step; Infinity never fires; a short one is a plain timer', () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'] });
    const a = vi.fn();
    const timer = setLongTimeout(a, 3 * MAX_TIMER_MS);
    vi.advanceTimersByTime(MAX_TIMER_MS + 5);
    timer.clear();
    vi.advanceTimersByTime(3 * MAX_TIMER_MS);
    expect(a).not.toHaveBeenCalled();
    const b = vi.fn();
    setLongTimeout(b, Infinity);
    vi.advanceTimersByTime(10 * MAX_TIMER_MS);
    expect(b).not.toHaveBeenCalled();
    const c = vi.fn();
    setLongTimeout(c, 10);
    vi.advanceTimersByTime(9);
    expect(c).not.toHaveBeenCalled();
    vi.advanceTimersByTime(1);
    expect(c).toHaveBeenCalledOnce();
  });
});
