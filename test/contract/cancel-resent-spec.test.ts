import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { RolloutRuntime } from '../../src/runtime.js';
import { mathTask, startHarness, type Harness } from '../support/harness.js';

/**
 * A client re-sends, when its stream opens, the specs it has no answer for (the Python client does so for every task
 * assigned before the stream was open: the spec then goes out twice). The second copy of an accepted task is a
 * duplicate, answered `accepted` once its submit gets through. A cancel that arrived while that copy was still on its
 * way (a busy server yields the event loop there) found it in the stream's "being submitted" set, not admitted, and
 * only aborted its admission, which a duplicate does not wait for: the task itself was never cancelled and its
 * samples ran on (python/tests test_cancel_ends_the_unfinished_samples_as_cancelled_infrastructure_failures hung).
 */
describe('a cancel that arrives while a re-sent spec of the task is still being answered', () => {
  let h: Harness;
  let submit: RolloutRuntime['submit'];
  beforeAll(async () => {
    // Tokens at 10 minutes each: the samples never end on their own, only the cancel ends them.
    h = await startHarness({}, { tokenLatencyMs: 600_000 });
    submit = h.server.runtime.submit.bind(h.server.runtime);
  });
  afterAll(async () => {
    if (h) h.server.runtime.submit = submit;
    await h?.close();
  });

  it('cancels the task: every sample ends CANCELLED', async () => {
    const runtime = h.server.runtime;
    // The re-sent copy is held in its submit until the stream's cancel reached it (its signal fires), as a busy
    // server's event loop holds it; bounded, so a server that never delivers the cancel there cannot hang the test.
    let calls = 0;
    runtime.submit = async (spec, options = {}) => {
      if (spec.taskId === 'resent-then-cancelled' && ++calls === 2) {
        const signal = options.signal;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, 5_000);
          const done = (): void => {
            clearTimeout(timer);
            resolve();
          };
          if (!signal || signal.aborted) done();
          else signal.addEventListener('abort', done, { once: true });
        });
      }
      return submit(spec, options);
    };
    const session = h.client.openSession();
    await session.opened;
    const task = mathTask('resent-then-cancelled', 3, 7);
    const first = session.submit(task);
    const again = session.submit(task);
    expect((await first).numSamples).toBe(3);
    session.cancel('resent-then-cancelled');
    // The copy is still answered `accepted` (the task is owed already); the cancel must reach the task all the same.
    expect(await again).toMatchObject({ taskId: 'resent-then-cancelled', numSamples: 3, alreadyOwed: true });
    expect(calls).toBe(2);
    session.close();

    const received: Trajectory[] = [];
    const iterator = session.trajectories()[Symbol.asyncIterator]();
    const deadline = Date.now() + 20_000;
    while (received.length < 3) {
      let timer: NodeJS.Timeout | undefined;
      const next = await Promise.race([
        iterator.next(),
        new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), Math.max(0, deadline - Date.now())))),
      ]).finally(() => clearTimeout(timer));
      if (next === 'timeout' || next.done) break;
      received.push(next.value);
    }
    if (received.length < 3) session.abort();
    expect(received.map((t) => `${t.sampleIndex}:${TrajectoryStatus[t.status]}`).sort()).toEqual([
      '0:TRAJECTORY_STATUS_CANCELLED',
      '1:TRAJECTORY_STATUS_CANCELLED',
      '2:TRAJECTORY_STATUS_CANCELLED',
    ]);
  });
});
