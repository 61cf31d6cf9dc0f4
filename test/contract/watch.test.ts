import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { Stage, type Trajectory, type WatchRequest } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, mathTask, startHarness, type Harness } from '../support/harness.js';
import { WatchRecorder } from '../support/watch-recorder.js';

const STAGE_CONCURRENCY = { init: 3, run: 2, eval: 5 };

describe('Watch: the read-only tail for dashboards', () => {
  let h: Harness;
  const watchers: WatchRecorder[] = [];
  beforeAll(async () => {
    h = await startHarness(
      {
        init: { concurrency: STAGE_CONCURRENCY.init, timeoutMs: 60_000 },
        run: { concurrency: STAGE_CONCURRENCY.run, timeoutMs: 60_000 },
        eval: { concurrency: STAGE_CONCURRENCY.eval, timeoutMs: 60_000 },
      },
      // Slow enough that samples are seen in flight by a 100 ms stats tick.
      { tokenLatencyMs: 3 },
    );
  });
  afterEach(() => {
    for (const w of watchers.splice(0)) w.cancel();
  });
  afterAll(async () => h?.close());

  /** A watcher that is subscribed on the server by the time this resolves. */
  async function watch(request: Partial<WatchRequest>): Promise<WatchRecorder> {
    const w = new WatchRecorder(h.client, { statsIntervalMs: 100, ...request });
    watchers.push(w);
    await w.ready();
    return w;
  }

  async function run(...tasks: TaskInput[]): Promise<Trajectory[]> {
    const session = h.client.openSession();
    for (const task of tasks) await session.submit(task);
    session.close();
    return collect(session.trajectories());
  }

  it('stage_events shows each sample go queued → init → run → eval, then its finished summary', async () => {
    const w = await watch({ stageEvents: true });
    const trajectories = await run(mathTask('w-stages', 2, 11, { groupId: 'wg-stages' }));
    await w.until(() => w.finished.filter((f) => f.taskId === 'w-stages').length === 2, 'both finished summaries');

    for (const t of trajectories) {
      const mine = (x: { taskId: string; sampleIndex: number }): boolean => x.taskId === 'w-stages' && x.sampleIndex === t.sampleIndex;
      const stages = w.stages.filter(mine);
      expect(stages.map((s) => Stage[s.stage])).toEqual(['STAGE_QUEUED', 'STAGE_INIT', 'STAGE_RUN', 'STAGE_EVAL', 'STAGE_DONE']);
      for (const s of stages) expect(s).toMatchObject({ groupId: 'wg-stages', environment: 'math' });
      expect(stages.map((s) => Number(s.unixMs))).toEqual([...stages.map((s) => Number(s.unixMs))].sort((a, b) => a - b));

      const summary = w.finished.find(mine)!;
      expect(summary).toMatchObject({
        groupId: 'wg-stages',
        environment: 'math',
        status: t.status,
        finishReason: t.finishReason,
        reward: t.reward,
        numTurns: t.numTurns,
        promptTokens: t.promptTokenIds.length,
        responseTokens: t.responseTokenIds.length,
      });
      expect(summary.timing!.totalMs).toBeGreaterThan(0);
      // The summary comes after the sample's last stage event, on the one ordered stream.
      const order = w.messages.map((m) => m.kind);
      const lastStage = order.findIndex((k) => k?.$case === 'stage' && mine(k.value) && k.value.stage === Stage.STAGE_DONE);
      const done = order.findIndex((k) => k?.$case === 'finished' && mine(k.value));
      expect(lastStage).toBeGreaterThanOrEqual(0);
      expect(done).toBeGreaterThan(lastStage);
    }
    // Without full_trajectories, no full trajectories are sent.
    expect(w.trajectories).toHaveLength(0);
  });

  it('filters by group_ids and environments: other groups never show up', async () => {
    const inGroup = await watch({ stageEvents: true, groupIds: ['wg-in'] });
    const noEnv = await watch({ stageEvents: true, environments: ['no-such-environment'] });
    const everything = await watch({ stageEvents: true });

    await run(mathTask('w-out', 2, 21, { groupId: 'wg-out' }), mathTask('w-in', 2, 22, { groupId: 'wg-in' }));
    // A sentinel in the watched group, submitted after the others have finished: once its summary arrives,
    // anything the server would have sent about wg-out is already in (one ordered stream per watcher).
    await run(mathTask('w-in-sentinel', 1, 23, { groupId: 'wg-in' }));
    await inGroup.until(() => inGroup.finished.some((f) => f.taskId === 'w-in-sentinel'), 'the sentinel summary');
    await everything.until(() => everything.finished.some((f) => f.taskId === 'w-in-sentinel'), 'the sentinel summary (unfiltered)');

    const groupsSeen = new Set([...inGroup.stages.map((s) => s.groupId), ...inGroup.finished.map((f) => f.groupId)]);
    expect([...groupsSeen]).toEqual(['wg-in']);
    expect(inGroup.finished.map((f) => `${f.taskId}#${f.sampleIndex}`).sort()).toEqual(['w-in#0', 'w-in#1', 'w-in-sentinel#0']);
    // The unfiltered watcher did see wg-out: the filter, not a lack of events, kept it out.
    expect(everything.finished.filter((f) => f.groupId === 'wg-out')).toHaveLength(2);
    expect(everything.stages.some((s) => s.groupId === 'wg-out')).toBe(true);
    // An environment nobody runs: only stats.
    expect(noEnv.messages.every((m) => m.kind?.$case === 'stats')).toBe(true);
  });

  it('full_trajectories sends the whole trajectory, the same the trainer got, instead of a summary', async () => {
    const w = await watch({ fullTrajectories: true });
    const trajectories = await run(mathTask('w-full', 2, 31, { groupId: 'wg-full', includeMessages: true }));
    await w.until(() => w.trajectories.filter((t) => t.taskId === 'w-full').length === 2, 'both full trajectories');

    const bySample = (ts: Trajectory[]): Trajectory[] => ts.filter((t) => t.taskId === 'w-full').sort((a, b) => a.sampleIndex - b.sampleIndex);
    const watched = bySample(w.trajectories);
    expect(watched).toEqual(bySample(trajectories));
    expect(watched[0]!.responseTokenIds.length).toBeGreaterThan(0);
    expect(watched[0]!.messages.length).toBeGreaterThan(0);
    expect(w.finished.filter((f) => f.taskId === 'w-full')).toHaveLength(0);
    expect(w.stages).toHaveLength(0); // stage_events was not asked for
  });

  it('stats_interval_ms sends PoolStats with each stage\u2019s concurrency, activity and the in-flight count', async () => {
    const w = await watch({});
    const completedBefore = Number(w.stats.at(-1)!.completedTotal);
    const trajectories = await run(mathTask('w-stats', 6, 41, { groupId: 'wg-stats' }));
    expect(trajectories).toHaveLength(6);
    await w.until(
      () => w.stats.some((s) => Number(s.completedTotal) >= completedBefore + 6 && s.inFlight === 0),
      'a stats message after the batch',
    );

    for (const s of w.stats) {
      expect(s.stages.map((x) => Stage[x.stage])).toEqual(['STAGE_INIT', 'STAGE_RUN', 'STAGE_EVAL']);
      expect(s.stages.map((x) => x.concurrency)).toEqual([STAGE_CONCURRENCY.init, STAGE_CONCURRENCY.run, STAGE_CONCURRENCY.eval]);
      for (const x of s.stages) {
        expect(x.active).toBeGreaterThanOrEqual(0);
        expect(x.active).toBeLessThanOrEqual(x.concurrency);
        expect(x.queued).toBeGreaterThanOrEqual(0);
      }
      expect(s.backends).toBe(1);
      expect(s.backendDetails).toHaveLength(1);
      expect(s.backendDetails[0]!.healthy).toBe(true);
      expect(s.admitted).toBeLessThanOrEqual(s.maxAdmitted);
      expect(Number(s.unixMs)).toBeGreaterThan(0);
    }
    // Some tick saw the backend carrying trajectories (sticky leases are counted per backend).
    expect(w.stats.some((s) => s.backendDetails[0]!.inflightTrajectories > 0)).toBe(true);
    // Some tick caught the batch in flight, with the run stage busy and bounded by its concurrency of 2.
    const busy = w.stats.filter((s) => s.inFlight > 0);
    expect(busy.length).toBeGreaterThan(0);
    expect(busy.some((s) => s.stages[1]!.active > 0)).toBe(true);
    expect(Math.max(...busy.map((s) => s.inFlight))).toBeLessThanOrEqual(6);
    // Stats are not filtered away by group filters, and carry no per-task events unless asked.
    expect(w.stages).toHaveLength(0);
  });
});
