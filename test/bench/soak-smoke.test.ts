import { describe, expect, it } from 'vitest';
import { runSoak } from '../../bench/soak/run.js';

/**
 * Keeps bench/soak.ts from rotting: its quick load for ~20 s without the kill step, against real processes (the
 * server as `rollout serve` in its own process, the fake vLLM double in another, bubblewrap for the math tasks),
 * asserting the accounting the full soak prints. Timings are printed by the bench, never asserted here.
 */
describe('bench/soak (quick, no kill)', () => {
  it('accounts for every submitted task exactly once and leaves no sandbox, cgroup, mount or process behind', async () => {
    const r = await runSoak({
      minutes: 0.3,
      concurrency: 200,
      sessions: 2,
      groupSize: 1,
      // 1 task in 10 in bubblewrap, so a short run still starts and stops real sandboxes.
      sandboxEvery: 10,
      killAt: undefined,
      journalDir: undefined,
      sampleSeconds: 2,
      drainTimeoutMs: 90_000,
      stopGraceMs: 30_000,
      verbose: false,
    });
    const c = r.counts;
    expect(r.problems).toEqual([]);
    expect(c.tasksSubmitted).toBeGreaterThan(200);
    expect(c.byState).toEqual({ sent: 0, accepted: 0, finished: c.tasksSubmitted, rejected: 0, lost: 0, missing: 0 });
    expect(c.trajectoriesReceived).toBe(c.samplesExpected);
    // The fake policies always finish: any other status is an infrastructure failure.
    expect(c.statuses).toEqual({ COMPLETED: c.trajectoriesReceived });
    expect(c.byEnvironment.math).toBeGreaterThan(0);
    expect(c.duplicatesAfterAck + c.redeliveredAckUnread + c.redeliveredAckInFlight + c.unknownTrajectories + c.malformedTrajectories).toBe(0);
    expect(r.leftovers).toEqual({ cgroups: [], cgroupProcesses: [], taggedProcesses: [], mounts: [], children: [] });
    expect(r.finalStop).toMatchObject({ forced: false, code: 0 });
    // The memory table has rows to print.
    expect(r.samples.length).toBeGreaterThan(3);
  }, 240_000);
});
