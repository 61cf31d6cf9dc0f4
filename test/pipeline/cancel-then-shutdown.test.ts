import { describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { journalSuite } from '../support/journal-suite.js';
import { eventually, within } from '../support/wait.js';
import { CountingDriver, probeEnvironment, probePolicy, probeTask, ProbeState } from '../support/probe-environment.js';

const S = TrajectoryStatus;
const suite = journalSuite();

// Regression (pipeline review, 2026-12-02): samples cancelled while the server stopped were all taken for the stop's
// own cancels (neither journaled nor delivered, run again after the restart), a client's cancel included: a task the
// trainer had cancelled ran again. Only Sample.cancelledByStop samples are left to run again now.
describe('a task the trainer cancelled, then the server shuts down (journal)', () => {
  it('stays cancelled: it is not run again after the restart', async () => {
    const dir = await suite.dir('cancel-shutdown-');
    const state1 = new ProbeState();
    const driver1 = new CountingDriver();
    driver1.stopDelayMs = 300; // a real sandbox's stop: PID namespace killed, cgroups removed
    const h1 = await suite.server(dir, { sandboxes: driver1, registry: defaultRegistry().register(probeEnvironment(state1)), engine: { policy: probePolicy } });
    const s1 = h1.client.openSession({ sessionId: 'trainer-c', autoAck: false });
    const it1 = (async () => {
      try {
        for await (const _ of s1.trajectories()) void _;
      } catch {
        // UNAVAILABLE
      }
    })();
    await s1.submit(probeTask('cancelled-by-trainer', { run: 'tool:g' }));
    await eventually(() => state1.count('g', 'tool', 'enter') === 1, 'in its run stage');
    // The trainer cancels it (a stale task it no longer wants); its cancel is accepted and is under way when the
    // operator stops the server a moment later (SIGTERM with no grace left).
    const cancelled = await h1.client.cancel('cancelled-by-trainer');
    expect(cancelled.cancelled).toBe(1);
    await within(h1.server.shutdown(), 20_000, 'shutdown');
    await it1;
    await h1.close();

    const state2 = new ProbeState();
    state2.open('g');
    const h2 = await suite.server(dir, { sandboxes: new CountingDriver(), registry: defaultRegistry().register(probeEnvironment(state2)), engine: { policy: probePolicy } });
    const s2 = h2.client.openSession({ sessionId: 'trainer-c', resume: true });
    s2.close();
    const got: Trajectory[] = [];
    for await (const t of s2.trajectories()) got.push(t);
    expect(state2.count('cancelled-by-trainer', 'init', 'enter'), 'the cancelled task ran again after the restart').toBe(0);
    expect(got.map((t) => `${t.taskId}:${S[t.status]}`)).toEqual(['cancelled-by-trainer:TRAJECTORY_STATUS_CANCELLED']);
  });
});
