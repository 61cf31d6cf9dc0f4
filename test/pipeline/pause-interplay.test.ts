import { afterEach, describe, expect, it } from 'vitest';
import { PauseMode } from '../../gen/ts/rollout/v1/backend.js';
import { StalenessAction, TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { limits, TrajectoryReader } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';
import { probeTask, startProbe, type ProbeHarness } from '../support/probe-environment.js';

const S = TrajectoryStatus;
const show = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex} ${S[t.status]} ${t.finishReason} ${t.error}`;
const harnesses: ProbeHarness[] = [];
afterEach(async () => {
  for (const h of harnesses.splice(0)) await h.close().catch(() => undefined);
});

describe('pause/resume and the pipeline', () => {
  it('while paused: a cancel, a total deadline and a run deadline end held samples at once with their own status; the rest complete after resume; the pool holds nothing', async () => {
    const h = await startProbe({ engine: { tokenLatencyMs: 5 } });
    harnesses.push(h);
    await h.client.pauseGeneration(PauseMode.PAUSE_MODE_ABORT);
    const session = h.client.openSession();
    const reader = new TrajectoryReader(session);
    await session.submit(probeTask('p-cancel', {}));
    await session.submit(probeTask('p-total', {}, { limits: limits({ totalTimeoutMs: 400 }) }));
    await session.submit(probeTask('p-run', {}, { limits: limits({ runTimeoutMs: 400 }) }));
    await session.submit(probeTask('p-ok', {}, { numSamples: 2 }));
    await eventually(() => h.server.pool.stats().inflightTrajectories === 5, 'five trajectories leased and held');
    session.cancel('p-cancel');
    const early = await reader.take(3);
    expect(Object.fromEntries(early.map((t) => [t.taskId, S[t.status]]))).toEqual({
      'p-cancel': 'TRAJECTORY_STATUS_CANCELLED',
      'p-total': 'TRAJECTORY_STATUS_TIMEOUT',
      'p-run': 'TRAJECTORY_STATUS_TIMEOUT',
    });
    expect(h.server.pool.stats().inflightTrajectories).toBe(2);
    await h.client.resumeGeneration({ policyVersion: 1 });
    session.close();
    const rest = await reader.rest();
    expect(rest.map(show)).toHaveLength(2);
    for (const t of rest) expect(S[t.status], show(t)).toBe('TRAJECTORY_STATUS_COMPLETED');
    const pool = h.server.pool.stats();
    expect([pool.inflightTrajectories, pool.inflightRequests, pool.leases, pool.waitingAcquires, pool.queuedRequests]).toEqual([0, 0, 0, 0, 0]);
  });

  it('KEEP: a cancel of a sample whose request is frozen in the engine ends it CANCELLED and frees the request', async () => {
    const h = await startProbe({ engine: { tokenLatencyMs: 20, policy: () => 'x '.repeat(40) } });
    harnesses.push(h);
    const session = h.client.openSession();
    const reader = new TrajectoryReader(session);
    await session.submit(probeTask('k-cancel', {}));
    await eventually(() => h.engine.inflightRequestIds().length === 1, 'request in the engine');
    await h.client.pauseGeneration(PauseMode.PAUSE_MODE_KEEP);
    session.cancel('k-cancel');
    const [t] = await reader.take(1);
    expect(S[t!.status], show(t!)).toBe('TRAJECTORY_STATUS_CANCELLED');
    await eventually(() => h.server.pool.stats().inflightRequests === 0, 'request freed');
    await h.client.resumeGeneration({ policyVersion: 1 });
    session.close();
    await reader.rest();
  });

  it('RESTART: a stale sample is run again; a cancel while it is back in init ends it CANCELLED once, its two sandboxes stopped', async () => {
    const h = await startProbe({ engine: { tokenLatencyMs: 10, policy: () => 'y '.repeat(30) } });
    harnesses.push(h);
    const session = h.client.openSession();
    const reader = new TrajectoryReader(session);
    await session.submit(
      probeTask('r-1', { init: 'second-gate:r-init' }, { limits: { ...limits({}), maxStaleness: 0, stalenessAction: StalenessAction.STALENESS_ACTION_RESTART } }),
    );
    await eventually(() => h.engine.inflightRequestIds().length === 1, 'first turn in the engine');
    await h.client.pauseGeneration(PauseMode.PAUSE_MODE_KEEP);
    await h.client.resumeGeneration({ policyVersion: 1 });
    // The turn spans v0 → v1: stale; the sample goes back to init, where it now waits.
    await eventually(() => h.state.count('r-1', 'init', 'enter') === 2, 'second init');
    session.cancel('r-1');
    const [t] = await reader.take(1);
    expect(S[t!.status], show(t!)).toBe('TRAJECTORY_STATUS_CANCELLED');
    expect(t!.stalenessRestarts).toBe(1);
    session.close();
    expect(await reader.rest()).toEqual([]);
    expect(h.driver.started).toBe(2);
    expect(h.driver.live).toBe(0);
    expect(h.server.runtime.pipeline.inFlight).toBe(0);
  });
});
