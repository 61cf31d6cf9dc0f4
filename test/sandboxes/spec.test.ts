import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config.js';
import { BubblewrapDriver } from '../../src/sandboxes/bwrap.js';
import { resolveSandboxSpec } from '../../src/sandboxes/spec.js';
import { MAX_TIMER_MS } from '../../src/timers.js';
import { testSpec } from './helpers.js';

// Regression: a Node timer fires a delay above 2^31 - 1 ms after 1 ms, so a sandbox asked for a longer wall clock or
// command timeout died (or timed its commands out) at once.
describe('sandbox timeouts beyond what a timer holds', () => {
  const config = parseConfig({}).sandbox;

  it("an environment's request: the wall clock is bounded by the task's total timeout; a longer command timeout is the plugin's mistake", () => {
    const spec = resolveSandboxSpec(config, { limits: { wallClockMs: 3e9 } }, 600_000);
    expect(spec.limits.wallClockMs).toBe(600_000);
    expect(() => resolveSandboxSpec(config, { limits: { commandTimeoutMs: MAX_TIMER_MS + 1 } }, 600_000)).toThrow(
      expect.objectContaining({ code: 'environment_error', message: expect.stringContaining('limits.commandTimeoutMs must be at most') }),
    );
  });

  it('the bubblewrap driver refuses them by field before starting anything', async () => {
    const driver = new BubblewrapDriver();
    for (const key of ['wallClockMs', 'commandTimeoutMs'] as const) {
      await expect(driver.start(testSpec({ [key]: MAX_TIMER_MS + 1 }))).rejects.toMatchObject({ code: 'invalid_argument', field: `limits.${key}` });
    }
  });
});
