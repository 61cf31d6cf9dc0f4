import { describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, mathTask } from '../support/harness.js';
import { limits, startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';
import { WatchRecorder } from '../support/watch-recorder.js';
import { Stage } from '../../gen/ts/rollout/v1/rollout.js';
import { parseExposition, sumOf, type MetricSample } from '../support/metrics-exposition.js';

// What a dashboard reads when samples end without running (their total deadline passes while they wait for a stage),
// against a real server, real bubblewrap sandboxes and the fake vLLM engine (a test double speaking vLLM's HTTP API),
// read from GET /metrics as a scraper would.

async function scrape(h: ServerHarness): Promise<MetricSample[]> {
  const res = await fetch(`http://${h.server.metrics!.address}/metrics`);
  expect(res.status).toBe(200);
  return parseExposition(await res.text());
}

/** Waits until nothing is counted busy, queued, admitted or in flight (stages, admission, engines), else fails naming what is not. */
async function gaugesBackToZero(h: ServerHarness): Promise<void> {
  const gauges = ['rollout_stage_active', 'rollout_stage_queued', 'rollout_samples_in_flight', 'rollout_samples_admitted', 'rollout_backend_inflight_requests', 'rollout_backend_inflight_trajectories'];
  let last: Record<string, number> = {};
  await eventually(async () => {
    const after = await scrape(h);
    last = Object.fromEntries(gauges.map((name) => [name, sumOf(after, name)]));
    return Object.values(last).every((v) => v === 0);
  }, 'every gauge back to 0').catch((err: unknown) => {
    throw new Error(`${String(err)}: ${JSON.stringify(last)}`);
  });
}

/** A server with one worker per stage (3 stage permits) and an engine taking 200 ms per token (seconds per turn). */
function startOneWorkerPerStage(): Promise<ServerHarness> {
  return startServerHarness({
    config: { metrics: { port: 0 }, init: { concurrency: 1 }, run: { concurrency: 1 }, eval: { concurrency: 1 } },
    engine: { tokenLatencyMs: 200 },
  });
}

describe('metrics of samples that end while they wait', () => {
  it('report the time a sample waited as its queue time (a timeout in the queue is not 0 s queued), and every gauge returns to 0', async () => {
    // One worker per stage: 3 stage permits. The engine takes 200 ms per token (seconds per turn), so no sample ends
    // before its 1.5 s total deadline, and at least the 5 without a permit wait it out queued.
    const h = await startOneWorkerPerStage();
    const watch = new WatchRecorder(h.client, { stageEvents: true, statsIntervalMs: 100 });
    try {
      await watch.ready();
      const session = h.client.openSession();
      await session.submit(mathTask('queued-timeout', 8, 7, { limits: limits({ totalTimeoutMs: 1_500 }) }));
      session.close();
      const got: Trajectory[] = await within(collect(session.trajectories()), 60_000, 'every trajectory delivered');
      expect(got).toHaveLength(8);
      expect(got.every((t) => t.status === TrajectoryStatus.TRAJECTORY_STATUS_TIMEOUT)).toBe(true);
      // At most the 3 holding a stage permit entered a stage before the deadline: every other sample waited its whole
      // 1.5 s queued (or entered init only as the first deadlines freed permits), and its queue time says so, never 0.
      const waitedOut = got.filter((t) => t.timing!.queueMs >= 1_400);
      expect(waitedOut.length, JSON.stringify(got.map((t) => t.timing))).toBeGreaterThanOrEqual(5);
      for (const t of got) expect(t.timing!.queueMs).toBeLessThanOrEqual(t.timing!.totalMs);
      // The Watch tells each sample finished once, as the trainer got it (status and times), and its stages end in done.
      await watch.until(() => watch.finished.length >= 8, 'every sample finished on the Watch');
      const key = (t: { taskId: string; sampleIndex: number }): string => `${t.taskId}#${t.sampleIndex}`;
      expect(watch.finished).toHaveLength(8);
      expect(new Set(watch.finished.map(key)).size).toBe(8);
      for (const t of got) {
        const told = watch.finished.find((f) => key(f) === key(t))!;
        expect(told.status).toBe(t.status);
        expect(told.timing!.queueMs).toBe(t.timing!.queueMs);
        expect(watch.stages.filter((e) => key(e) === key(t) && e.stage === Stage.STAGE_DONE)).toHaveLength(1);
      }
      const s = await scrape(h);
      expect(sumOf(s, 'rollout_trajectories_total', { environment: 'math', status: 'timeout' })).toBe(got.filter((t) => t.status === TrajectoryStatus.TRAJECTORY_STATUS_TIMEOUT).length);
      // The histogram holds seconds, one observation per trajectory, and the waits of those that timed out in the queue.
      expect(sumOf(s, 'rollout_trajectory_seconds_count', { environment: 'math', phase: 'queue' })).toBe(8);
      const queueSum = sumOf(s, 'rollout_trajectory_seconds_sum', { environment: 'math', phase: 'queue' });
      expect(queueSum).toBeCloseTo(got.reduce((a, t) => a + t.timing!.queueMs, 0) / 1000, 3);
      expect(queueSum).toBeGreaterThanOrEqual(waitedOut.length * 1.4);
      // Nothing is left counted as busy, queued or admitted once every sample was delivered.
      await gaugesBackToZero(h);
      // And the Watch's pool statistics say the same.
      const seen = watch.stats.length;
      await watch.until(() => watch.stats.length > seen + 1, 'a fresh stats message');
      const stats = watch.stats.at(-1)!;
      expect({ inFlight: stats.inFlight, admitted: stats.admitted, busy: stats.stages.reduce((a, x) => a + x.active + x.queued, 0) }).toEqual({ inFlight: 0, admitted: 0, busy: 0 });
      expect(stats.completedTotal).toBe(8);
    } finally {
      watch.cancel();
      await h.close();
    }
  }, 90_000);

  it('count the engine time of a turn cut by the run deadline as llm time (a slow engine is what the figures show)', async () => {
    // The engine takes 200 ms per token (several seconds per turn); the run stage has 1.5 s: each sample ends TIMEOUT
    // inside its first engine request.
    const h = await startServerHarness({ config: { metrics: { port: 0 } }, engine: { tokenLatencyMs: 200 } });
    try {
      const session = h.client.openSession();
      await session.submit(mathTask('llm-timeout', 2, 9, { limits: limits({ runTimeoutMs: 1_500 }) }));
      session.close();
      const got: Trajectory[] = await within(collect(session.trajectories()), 60_000, 'every trajectory delivered');
      expect(got).toHaveLength(2);
      for (const t of got) {
        expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_TIMEOUT);
        expect(t.timing!.runMs).toBeGreaterThanOrEqual(1_400);
        // Its run was the engine's turn (after the prompt's render, which a loaded box may take a while for): not 0 s of
        // llm time.
        expect(t.timing!.llmMs).toBeGreaterThanOrEqual(t.timing!.runMs / 3);
        // (The turn's end is heard just after the stage's: the abort reaches the engine request a moment later.)
        expect(t.timing!.llmMs).toBeLessThanOrEqual(t.timing!.runMs + 250);
      }
      const s = await scrape(h);
      expect(sumOf(s, 'rollout_trajectory_seconds_sum', { environment: 'math', phase: 'llm' })).toBeCloseTo(got.reduce((a, t) => a + t.timing!.llmMs, 0) / 1000, 3);
      await gaugesBackToZero(h);
    } finally {
      await h.close();
    }
  }, 90_000);

  it("count a client's cancel once per sample as cancelled, with the time each spent queued or in the engine; every gauge returns to 0", async () => {
    const h = await startOneWorkerPerStage();
    const watch = new WatchRecorder(h.client, { stageEvents: true, statsIntervalMs: 100 });
    try {
      await watch.ready();
      const session = h.client.openSession();
      await session.submit(mathTask('cancelled', 5, 11));
      // One sample in the engine's turn (its run began), the others waiting for a stage.
      await watch.until(() => watch.stages.some((e) => e.stage === Stage.STAGE_RUN), 'a sample in its run');
      await eventually(() => h.engine.stats().inflight >= 1, 'its engine request under way');
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect((await h.client.cancel('cancelled')).cancelled).toBe(5);
      session.close();
      const got: Trajectory[] = await within(collect(session.trajectories()), 60_000, 'every trajectory delivered');
      expect(got.map((t) => t.status)).toEqual(Array(5).fill(TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED));
      const ran = got.filter((t) => t.timing!.runMs > 0);
      expect(ran).toHaveLength(1);
      expect(ran[0]!.timing!.llmMs).toBeGreaterThanOrEqual(250);
      for (const t of got.filter((x) => x.timing!.initMs === 0)) expect(t.timing!.queueMs).toBeGreaterThanOrEqual(250);
      const s = await scrape(h);
      expect(sumOf(s, 'rollout_trajectories_total')).toBe(5);
      expect(sumOf(s, 'rollout_trajectories_total', { environment: 'math', status: 'cancelled' })).toBe(5);
      expect(sumOf(s, 'rollout_reward_count')).toBe(0);
      await watch.until(() => watch.finished.length >= 5, 'every sample finished on the Watch');
      expect(new Set(watch.finished.map((f) => f.sampleIndex)).size).toBe(5);
      expect(watch.finished.every((f) => f.status === TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED)).toBe(true);
      await gaugesBackToZero(h);
    } finally {
      watch.cancel();
      await h.close();
    }
  }, 90_000);
});
