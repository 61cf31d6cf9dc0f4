import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { Sample } from '../../src/pipeline/sample.js';
import { probeTask, startProbe, type ProbeHarness } from '../support/probe-environment.js';
import { eventually } from '../support/wait.js';

// From the session-43 pipeline review. Samples wait before init for a stage permit (init + run + eval concurrency of
// them, see Pipeline.permits) while every permit is held: a long weight-update pause, slow SWE episodes. A trainer that
// over-submits and cancels what has not started (partial rollouts) cancels exactly those. Each is delivered CANCELLED
// at once — but the permit queue kept every one of them (its task, instance and all) until the permits moved on
// again: memory growing with every cancel for as long as the line is held up.

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

let h: ProbeHarness;
beforeAll(async () => {
  // Three permits: one each for init, run and eval.
  h = await startProbe({ config: { init: { concurrency: 1 }, run: { concurrency: 1 }, eval: { concurrency: 1 } } });
});
afterAll(async () => h?.close());

describe('samples cancelled while they wait for a stage permit', () => {
  it('are delivered CANCELLED and let go of: nothing of theirs is kept while the permits stay held', async () => {
    const refs: WeakRef<Sample>[] = [];
    const sub = h.server.runtime.pipeline.events$.subscribe((e) => {
      if (e.type === 'stage' && e.stage === 'queued' && e.sample.task.taskId.startsWith('w-')) refs.push(new WeakRef(e.sample));
    });
    const session = h.client.openSession();
    const got: Trajectory[] = [];
    const reading = (async () => {
      try {
        for await (const t of session.trajectories()) got.push(t);
      } catch {
        // Only when an assertion failed first: the stream then ends with the server.
      }
    })();
    // Three samples take the three permits and stay (init waits at a gate that opens at the end).
    for (let i = 0; i < 3; i++) await session.submit(probeTask(`hold-${i}`, { init: 'gate:s43-hold' }));
    await eventually(() => h.state.count('hold-0', 'init', 'enter') === 1, 'the first holder in init');
    const waiting = Array.from({ length: 40 }, (_, i) => `w-${i}`);
    for (const id of waiting) await session.submit(probeTask(id, {}));
    await eventually(() => refs.length === waiting.length, 'every waiting sample queued');
    for (const id of waiting) await h.client.cancel(id);
    await eventually(() => got.length === waiting.length, 'the cancelled samples delivered');
    expect(got.map((t) => TrajectoryStatus[t.status])).toEqual(waiting.map(() => 'TRAJECTORY_STATUS_CANCELLED'));
    sub.unsubscribe();

    // The holders still hold every permit: the cancelled samples must be garbage now all the same.
    expect(h.state.count('hold-0', 'init', 'leave')).toBe(0);
    // Collected in a job of its own: a WeakRef's deref() keeps its target alive until the job that called it ends.
    const live = async (): Promise<string[]> => {
      await sleep(50);
      gc();
      await sleep(0);
      return refs.filter((r) => r.deref() !== undefined).map((r) => r.deref()!.key);
    };
    let kept = await live();
    for (let round = 0; round < 5 && kept.length > 0; round++) kept = await live();
    expect(kept).toEqual([]);

    h.state.open('s43-hold');
    session.close();
    await reading;
    expect(got.filter((t) => t.taskId.startsWith('hold-')).map((t) => TrajectoryStatus[t.status])).toEqual(Array(3).fill('TRAJECTORY_STATUS_COMPLETED'));
    expect(h.driver.live).toBe(0);
    expect(h.server.runtime.pipeline.inFlight).toBe(0);
  }, 60_000);
});
