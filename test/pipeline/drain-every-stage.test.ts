import { afterEach, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { RolloutSession } from '../../src/client/rollout-client.js';
import { eventually, within } from '../support/wait.js';
import { probeTask, startProbe, type ProbeHarness } from '../support/probe-environment.js';

const S = TrajectoryStatus;
const harnesses: ProbeHarness[] = [];
afterEach(async () => {
  for (const h of harnesses.splice(0)) await h.close().catch(() => undefined);
});

/** Iterates a session to its end (auto-acking each trajectory, as the client does by default). */
async function iterate(session: RolloutSession): Promise<{ got: Trajectory[]; err: unknown }> {
  const got: Trajectory[] = [];
  try {
    for await (const t of session.trajectories()) got.push(t);
    return { got, err: undefined };
  } catch (err) {
    return { got, err };
  }
}

// Regression (pipeline review, 2026-12-02): the drained stream ended its readable itself (push(null)) while grpc-js had
// a read under way; the client's ack of the last trajectories was then pushed after the end, which destroyed the call:
// trajectories lost, the drain stuck until the transport was cut, the client seeing CANCELLED instead of UNAVAILABLE.
describe('drain with work in every stage', () => {
  it('past the grace, every sample (in init, run, eval, waiting for a slot; stuck stage code too) reaches the trainer CANCELLED and the stream ends UNAVAILABLE', async () => {
    const h = await startProbe({ config: { init: { concurrency: 2 }, eval: { concurrency: 2 } } });
    harnesses.push(h);
    const session = h.client.openSession();
    const iterated = iterate(session);
    await session.submit(probeTask('in-run', { run: 'tool:never' }));
    await session.submit(probeTask('in-eval', { eval: 'hang' }));
    await session.submit(probeTask('in-eval-stuck', { eval: 'stuck' }));
    await eventually(() => h.state.count('never', 'tool', 'enter') === 1 && h.state.count('in-eval', 'eval', 'enter') === 1 && h.state.count('in-eval-stuck', 'eval', 'enter') === 1, 'run and eval occupied');
    await session.submit(probeTask('in-init', { init: 'hang' }));
    await session.submit(probeTask('in-init-stuck', { init: 'stuck' }));
    await eventually(() => h.state.count('in-init', 'init', 'enter') === 1 && h.state.count('in-init-stuck', 'init', 'enter') === 1, 'init occupied');
    for (let i = 0; i < 4; i++) await session.submit(probeTask(`wait-init-slot-${i}`, {}));
    await eventually(() => h.server.runtime.pipeline.stageStats().find((s) => s.stage === 'init')!.queued === 4, 'four queued for init');
    expect(h.server.runtime.pipeline.inFlight).toBe(9);

    const started = Date.now();
    await within(h.server.drain({ graceMs: 200 }), 20_000, 'drain');
    const drainMs = Date.now() - started;
    const { got, err } = await iterated;
    const ids = ['in-eval', 'in-eval-stuck', 'in-init', 'in-init-stuck', 'in-run', 'wait-init-slot-0', 'wait-init-slot-1', 'wait-init-slot-2', 'wait-init-slot-3'];
    // The server itself handed all nine CANCELLED trajectories to the session before it said "drained"...
    expect(h.driver.live).toBe(0);
    expect(h.state.signals.every((s) => s.aborted)).toBe(true);
    // ...and the trainer must get every one of them, then UNAVAILABLE, without the transport being cut after 5 s.
    expect(got.map((t) => `${t.taskId}:${S[t.status]}`).sort(), `stream ended with ${String(err)} after ${drainMs} ms`).toEqual(ids.map((id) => `${id}:TRAJECTORY_STATUS_CANCELLED`).sort());
    expect(String(err)).toMatch(/UNAVAILABLE/);
    expect(drainMs).toBeLessThan(4_000);
  });

  it('an ack the trainer sends while the drained stream is being flushed does not destroy the stream (no lost trajectory, status UNAVAILABLE)', async () => {
    const h = await startProbe({ config: { init: { concurrency: 64 } } });
    harnesses.push(h);
    const session = h.client.openSession(); // autoAck: each trajectory is acked as the loop takes it
    const iterated = iterate(session);
    const n = 16;
    await session.submit(probeTask('group', { init: 'hang' }, { numSamples: n }));
    await eventually(() => h.state.count('group', 'init', 'enter') === n, 'every sample in init');
    const started = Date.now();
    await within(h.server.drain({ graceMs: 0 }), 20_000, 'drain');
    const drainMs = Date.now() - started;
    const { got, err } = await iterated;
    expect(got.length, `got ${got.length} of ${n}; stream ended with ${String(err)} after ${drainMs} ms`).toBe(n);
    expect(String(err)).toMatch(/UNAVAILABLE/);
  });

  it('control (passes): the same drain with a client that sends no acks gets all 16 and UNAVAILABLE — the ack is what breaks it', async () => {
    const h = await startProbe({ config: { init: { concurrency: 64 } } });
    harnesses.push(h);
    const session = h.client.openSession({ autoAck: false });
    const iterated = iterate(session);
    const n = 16;
    await session.submit(probeTask('group-noack', { init: 'hang' }, { numSamples: n }));
    await eventually(() => h.state.count('group-noack', 'init', 'enter') === n, 'every sample in init');
    await within(h.server.drain({ graceMs: 0 }), 20_000, 'drain');
    const { got, err } = await iterated;
    expect(got.length).toBe(n);
    expect(String(err)).toMatch(/UNAVAILABLE/);
  });
});
