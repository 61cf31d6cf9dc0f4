import { status, type ServiceError } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { ServerLifecycle, type LifecycleState } from '../../src/lifecycle.js';
import { RolloutError } from '../../src/errors.js';
import { TaskRejectedError } from '../../src/client/rollout-client.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { liveSandboxes, startServerHarness } from '../support/server-harness.js';
import { healthStatuses } from '../support/health.js';
import { eventually, within } from '../support/wait.js';

describe('ServerLifecycle: one state, two signals', () => {
  it('walks starting → running → draining → drained → stopped, firing admission at draining and the lifetime signal at drained', async () => {
    const lifecycle = new ServerLifecycle();
    const seen: LifecycleState[] = [];
    lifecycle.state$.subscribe((s) => seen.push(s));
    const stopped = lifecycle.until('stopped');
    expect(lifecycle.admitting).toBe(false);
    lifecycle.transition('running');
    expect(lifecycle.admitting).toBe(true);
    lifecycle.transition('draining');
    expect(lifecycle.admitting).toBe(false);
    expect(lifecycle.admission.aborted).toBe(true);
    expect((lifecycle.admission.reason as RolloutError).code).toBe('unavailable');
    expect(lifecycle.signal.aborted).toBe(false);
    lifecycle.transition('drained');
    expect(lifecycle.signal.aborted).toBe(true);
    expect((lifecycle.signal.reason as RolloutError).message).toMatch(/shutting down/);
    lifecycle.transition('stopped');
    await stopped;
    expect(seen).toEqual(['starting', 'running', 'draining', 'drained', 'stopped']);
  });

  it('refuses transitions it does not have, and failed ends everything', async () => {
    const lifecycle = new ServerLifecycle();
    expect(() => lifecycle.transition('draining')).toThrow(/starting → draining/);
    lifecycle.transition('running');
    expect(() => lifecycle.transition('running')).toThrow(RolloutError);
    lifecycle.transition('failed');
    expect(lifecycle.admission.aborted && lifecycle.signal.aborted).toBe(true);
    await lifecycle.until('stopped'); // failed counts as past everything
    expect(() => lifecycle.transition('stopped')).toThrow(/failed → stopped/);
  });
});

describe('drain of an in-process server', () => {
  it('a task waiting for admission is rejected as draining; the admitted one finishes within the grace; state, health and sandboxes follow', async () => {
    // One sample admitted at a time; 20 ms per token keeps the first one running while the second waits.
    const h = await startServerHarness({ config: { maxAdmitted: 1, drainGraceMs: 120_000 }, engine: { tokenLatencyMs: 20 } });
    try {
      // Refusals come back at once (no client retry): the test watches the draining refusal itself.
      const session = h.client.openSession({ retryRejectedForMs: 0 });
      const first = session.submit(mathTask('admitted', 1, 11));
      await first;
      const second = session.submit(mathTask('waiting', 1, 12));
      await eventually(() => h.server.runtime.admission.waiting === 1, 'the second task to wait for admission', 30_000);
      const iterated = (async () => {
        const got = [];
        try {
          for await (const t of session.trajectories()) got.push(t);
        } catch (err) {
          return { got, err: err as ServiceError };
        }
        return { got, err: undefined };
      })();

      const drained = h.server.drain();
      expect(h.server.lifecycle.state).toBe('draining');
      const rejected = (await second.catch((e: unknown) => e)) as TaskRejectedError;
      expect(rejected).toBeInstanceOf(TaskRejectedError);
      expect(rejected.reason).toMatch(/draining/);
      expect(Object.values(await healthStatuses(h.server.address))).toEqual(['NOT_SERVING', 'NOT_SERVING', 'NOT_SERVING', 'NOT_SERVING']);
      // A unary call arriving now is refused the same way.
      const unary = (await h.client.submit(mathTask('too-late', 1, 13)).catch((e: unknown) => e)) as ServiceError;
      expect(unary.code).toBe(status.UNAVAILABLE);

      await within(drained, 120_000, 'the drain');
      expect(h.server.lifecycle.state).toBe('stopped');
      const { got, err } = await iterated;
      expect(got.map((t) => [t.taskId, t.status])).toEqual([['admitted', TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED]]);
      expect(err?.code).toBe(status.UNAVAILABLE);
      expect(await liveSandboxes()).toEqual([]);
    } finally {
      await h.close();
    }
  }, 180_000);

  it('a second drain with a shorter grace brings the cancellation forward', async () => {
    const h = await startServerHarness({ config: { drainGraceMs: 600_000 }, engine: { tokenLatencyMs: 500 } });
    try {
      const session = h.client.openSession();
      await session.submit(mathTask('slow', 2, 21));
      await eventually(() => h.server.runtime.pipeline.stageStats().find((s) => s.stage === 'run')!.active === 2, 'both samples running', 30_000);
      const iterated = (async () => {
        const got = [];
        try {
          for await (const t of session.trajectories()) got.push(t);
        } catch {
          // the stream ends UNAVAILABLE
        }
        return got;
      })();
      const long = h.server.drain();
      await eventually(() => h.server.lifecycle.state === 'draining', 'draining');
      void h.server.drain({ graceMs: 200 });
      await within(long, 60_000, 'the drain to end once its grace was shortened');
      const got = await iterated;
      expect(got.map((t) => t.status)).toEqual([TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED, TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED]);
      expect(got.every((t) => /grace period/.test(t.error))).toBe(true);
    } finally {
      await h.close();
    }
  }, 120_000);
});
