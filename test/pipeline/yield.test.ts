import { afterEach, describe, expect, it } from 'vitest';
import type { StageFn } from '../../src/pipeline/pipeline.js';
import { YIELD_AFTER_MS, yieldIfBusy } from '../../src/pipeline/yield.js';
import { PipelineRig } from '../support/pipeline-fixtures.js';
import { eventually } from '../support/wait.js';

const rigs: PipelineRig[] = [];
afterEach(async () => {
  for (const r of rigs.splice(0)) await r.stop();
});

/** Holds the thread for `ms` (synchronous work, as rendering or encoding a long context is). */
function spin(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    // busy
  }
}

describe('yieldIfBusy', () => {
  it('returns at once after a turn of the loop, and a turn (timers run) once the loop was held past the bound', async () => {
    await (yieldIfBusy() ?? Promise.resolve());
    expect(yieldIfBusy()).toBeUndefined();
    spin(YIELD_AFTER_MS + 1);
    let timerRan = false;
    setTimeout(() => (timerRan = true), 0);
    spin(2); // the timer is due
    const turn = yieldIfBusy();
    expect(turn).toBeInstanceOf(Promise);
    // Callers meanwhile share the one turn.
    expect(yieldIfBusy()).toBe(turn);
    await turn;
    expect(timerRan).toBe(true);
    expect(yieldIfBusy()).toBeUndefined();
  });
});

describe('the pipeline lets the event loop run inside a long chain of synchronous work', () => {
  it('samples whose stages finish synchronously do not hold the loop for the whole chain: a 1 ms interval keeps ticking', async () => {
    let ticks = 0;
    const interval = setInterval(() => ticks++, 1);
    try {
      const seen: number[] = [];
      // Every stage holds the thread 1 ms and returns without awaiting anything: without the pipeline's yields, 60
      // samples x 3 stages would run as one chain of microtasks and the interval would not tick once in between.
      const busy: StageFn = async () => {
        seen.push(ticks);
        spin(1);
      };
      const r = new PipelineRig({ init: busy, run: busy, eval: busy }, { init: 64, run: 64, eval: 64 });
      rigs.push(r);
      const samples = r.submit(...Array.from({ length: 60 }, (_, i) => r.sample(`chain-${i}`)));
      await eventually(() => samples.every((s) => r.deliveriesOf(s) === 1), 'every sample delivered', 10_000);
      expect(seen).toHaveLength(180);
      // The interval ran many times while the chain was under way (~180 ms of work, a turn every ~2 ms): no stage
      // saw more than a few others start since the interval last ticked.
      expect(seen.at(-1)! - seen[0]!).toBeGreaterThan(10);
      const runs = new Map<number, number>();
      for (const t of seen) runs.set(t, (runs.get(t) ?? 0) + 1);
      expect(Math.max(...runs.values())).toBeLessThanOrEqual(8);
    } finally {
      clearInterval(interval);
    }
  });
});
