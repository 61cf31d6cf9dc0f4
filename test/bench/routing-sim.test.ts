import { describe, expect, it } from 'vitest';
import { defaultEngines } from '../../bench/routing/engines.js';
import { invariantProblems } from '../../bench/routing/invariants.js';
import { POLICIES } from '../../bench/routing/routers.js';
import { simulate } from '../../bench/routing/simulate.js';
import { DEFAULT_WORKLOAD, makeWorkload } from '../../bench/routing/workload.js';

/** bench/routing's simulator on a small seeded scenario: its invariants, never its timings. */
const workload = makeWorkload({ trajectories: 300, seed: 7, ...DEFAULT_WORKLOAD });
const scenario = { engines: defaultEngines(), workload, concurrency: 60 };

describe('routing simulator', () => {
  it.each(POLICIES)('%s: every trajectory finishes, no engine exceeds its sequences, cache hits only on the sticky engine', async (policy) => {
    const report = await simulate(policy, scenario);
    expect(invariantProblems(report, workload, scenario.engines)).toEqual([]);
    expect(report.trajectories.filter((t) => Number.isFinite(t.end))).toHaveLength(workload.length);
    for (const e of report.engines) {
      expect(e.maxRunning).toBeLessThanOrEqual(e.maxSequences);
      expect(e.hitsOffSticky).toBe(0);
    }
    expect(report.engines.reduce((s, e) => s + e.requests, 0)).toBe(workload.reduce((s, t) => s + t.outputTokens.length, 0));
  });

  it('keeps every trajectory on one engine under the production pool, in proportion to capacity', async () => {
    const report = await simulate('capacity-heap', scenario);
    for (const t of report.trajectories) expect(new Set(t.engines).size).toBe(1);
    const [large0, , small0] = report.engines;
    expect(large0!.trajectories).toBeGreaterThan(2 * small0!.trajectories);
  });

  it('is deterministic: the same seed gives the same run', async () => {
    const a = await simulate('capacity-heap', scenario);
    const b = await simulate('capacity-heap', scenario);
    expect(b.trajectories).toEqual(a.trajectories);
    expect(b.makespan).toBe(a.makespan);
  });
});
