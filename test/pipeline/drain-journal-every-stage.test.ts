import { describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { journalSuite } from '../support/journal-suite.js';
import { eventually, within } from '../support/wait.js';
import { CountingDriver, probeEnvironment, probePolicy, probeTask, ProbeState } from '../support/probe-environment.js';

const S = TrajectoryStatus;
const suite = journalSuite();

function probeOptions(state: ProbeState, driver: CountingDriver) {
  return { sandboxes: driver, registry: defaultRegistry().register(probeEnvironment(state)), engine: { policy: probePolicy } };
}

describe('drain with a journal and work in every stage', () => {
  it('nothing cut short is delivered; after a restart, the resumed session gets one real trajectory per sample', async () => {
    const dir = await suite.dir('review-drain-journal-');
    const state1 = new ProbeState();
    const driver1 = new CountingDriver();
    const h1 = await suite.server(dir, probeOptions(state1, driver1));
    const s1 = h1.client.openSession({ sessionId: 'trainer-1', autoAck: false });
    const got1: Trajectory[] = [];
    const it1 = (async () => {
      try {
        for await (const t of s1.trajectories()) got1.push(t);
      } catch {
        // UNAVAILABLE at drain
      }
    })();
    await s1.submit(probeTask('j-run', { run: 'tool:g-run' }));
    await s1.submit(probeTask('j-eval', { eval: 'gate:g-eval' }));
    await s1.submit(probeTask('j-init', { init: 'gate:g-init' }));
    await s1.submit(probeTask('j-group', { run: 'odd:g-odd' }, { numSamples: 4, sampling: { seed: 3, maxTokensPerTurn: 64, maxTotalTokens: 2048, stop: [] } }));
    await eventually(() => state1.count('g-run', 'tool', 'enter') === 1 && state1.count('j-eval', 'eval', 'enter') === 1 && state1.count('j-init', 'init', 'enter') === 1, 'every stage occupied');
    await eventually(() => got1.length === 2, 'half the group delivered');
    await within(h1.server.drain({ graceMs: 100 }), 20_000, 'drain');
    await it1;
    expect(got1.map((t) => `${t.taskId}#${t.sampleIndex}:${S[t.status]}`).sort()).toEqual(['j-group#0:TRAJECTORY_STATUS_COMPLETED', 'j-group#2:TRAJECTORY_STATUS_COMPLETED']);
    expect(driver1.live).toBe(0);
    await h1.close();

    const state2 = new ProbeState();
    for (const g of ['g-run', 'g-eval', 'g-init', 'g-odd']) state2.open(g);
    const h2 = await suite.server(dir, probeOptions(state2, new CountingDriver()));
    const s2 = h2.client.openSession({ sessionId: 'trainer-1', resume: true });
    s2.close();
    const got2: Trajectory[] = [];
    for await (const t of s2.trajectories()) got2.push(t);
    // The two it never acked come again; the five cut short run again and come once each.
    expect(got2.map((t) => `${t.taskId}#${t.sampleIndex}:${S[t.status]}`).sort()).toEqual(
      ['j-eval#0', 'j-group#0', 'j-group#1', 'j-group#2', 'j-group#3', 'j-init#0', 'j-run#0'].map((k) => `${k}:TRAJECTORY_STATUS_COMPLETED`),
    );
  });
});
