import { afterEach, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { TrajectoryReader } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';
import { probeTask, startProbe, type ProbeHarness } from '../support/probe-environment.js';

const S = TrajectoryStatus;
const harnesses: ProbeHarness[] = [];
afterEach(async () => {
  for (const h of harnesses.splice(0)) await h.close().catch(() => undefined);
});

// Regression (pipeline review, 2026-12-02): stages hand on through unbounded mergeMap buffers, so init ran ahead of a
// full run stage for every admitted sample: 40 live sandboxes (each past its environment's setup) with 2 running.
// Samples now take a stage permit (init + run + eval concurrency of them) before init.
describe('backpressure between stages', () => {
  it('while run is saturated, init does not start sandboxes for every admitted sample (live sandboxes stay near the stage limits, not maxAdmitted)', async () => {
    const concurrency = { init: 2, run: 2, eval: 2 };
    const h = await startProbe({ config: { init: { concurrency: concurrency.init }, run: { concurrency: concurrency.run }, eval: { concurrency: concurrency.eval } } });
    harnesses.push(h);
    const session = h.client.openSession();
    const reader = new TrajectoryReader(session);
    // One group of 40: each sample's run waits at a gate (a long agent episode), so run holds its two slots.
    const n = 40;
    await session.submit(probeTask('slow-run', { run: 'tool:slow-run' }, { numSamples: n }));
    await eventually(() => h.state.count('slow-run', 'tool', 'enter') === concurrency.run, 'run saturated');
    await eventually(() => h.state.count('slow-run', 'init', 'leave') === n, 'init finished', 3_000).catch(() => undefined);
    const stats = Object.fromEntries(h.server.runtime.pipeline.stageStats().map((s) => [s.stage, `${s.active} active / ${s.queued} queued`]));
    const bound = concurrency.init + concurrency.run + concurrency.eval;
    expect(h.driver.live, `live sandboxes with ${concurrency.run} samples running; stages: ${JSON.stringify(stats)}`).toBeLessThanOrEqual(bound);
    h.state.open('slow-run');
    session.close();
    const all = await reader.rest();
    expect(all.filter((t) => t.status === S.TRAJECTORY_STATUS_COMPLETED)).toHaveLength(n);
  });
});
