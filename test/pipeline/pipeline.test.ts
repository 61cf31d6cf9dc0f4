import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import type { StageFn, StageFns, StageStats } from '../../src/pipeline/pipeline.js';
import type { Sample } from '../../src/pipeline/sample.js';
import type { ResolvedLimits } from '../../src/pipeline/task.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { CountingSample, CountingSandbox, PipelineRig, fakeRunResult } from '../support/pipeline-fixtures.js';
import { abortableSleep, eventually, gate, type Gate } from '../support/wait.js';

type WorkStage = 'init' | 'run' | 'eval';
const STAGES: readonly WorkStage[] = ['init', 'run', 'eval'];
const S = TrajectoryStatus;

/** A promise that never settles: a stage that ignores its AbortSignal and never returns. */
const forever = (): Promise<void> => new Promise<void>(() => undefined);

/** Init that starts a counting sandbox first, then does `rest` (so every later path has a sandbox to release). */
function initWithSandbox(rest: StageFn = async () => undefined): StageFn {
  return async (sample, signal) => {
    const sandbox = new CountingSandbox(`sbx-${sample.key}`);
    if (sample instanceof CountingSample) sample.ownSandbox = sandbox;
    sample.sandbox = sandbox;
    await rest(sample, signal);
  };
}

const rigs: PipelineRig[] = [];
function rig(fns: Partial<StageFns> = {}, concurrency: Partial<Record<WorkStage, number>> = {}): PipelineRig {
  const r = new PipelineRig(fns, concurrency);
  rigs.push(r);
  return r;
}
afterEach(async () => {
  for (const r of rigs.splice(0)) await r.stop();
});

async function delivered(r: PipelineRig, samples: Sample[], timeoutMs = 10_000): Promise<void> {
  await eventually(() => samples.every((s) => r.deliveriesOf(s) > 0), `${samples.length} trajectories`, timeoutMs);
}

describe('Pipeline: per-stage concurrency', () => {
  it('never runs more samples in a stage than its limit, and each stage fills its own limit under load', async () => {
    const limits = { init: 2, run: 3, eval: 1 };
    const active = { init: 0, run: 0, eval: 0 };
    const max = { init: 0, run: 0, eval: 0 };
    let maxTotal = 0;
    const statsSeen: StageStats[][] = [];
    const measured = (stage: WorkStage, ms: number, then?: StageFn): StageFn => async (sample, signal) => {
      active[stage]++;
      max[stage] = Math.max(max[stage], active[stage]);
      maxTotal = Math.max(maxTotal, active.init + active.run + active.eval);
      try {
        await abortableSleep(ms, signal);
        await then?.(sample, signal);
      } finally {
        active[stage]--;
      }
    };
    const r = rig(
      {
        init: measured('init', 4, initWithSandbox()),
        run: measured('run', 25, async (s) => void (s.run = fakeRunResult())),
        eval: measured('eval', 4, async (s) => void (s.evaluation = { reward: 1, details: {}, report: {} })),
      },
      limits,
    );
    const samples = r.submit(...Array.from({ length: 24 }, (_, i) => r.sample(`load-${i}`)));
    const poll = setInterval(() => statsSeen.push(r.pipeline.stageStats()), 2);
    try {
      await delivered(r, samples, 15_000);
    } finally {
      clearInterval(poll);
    }

    expect(max.init).toBeLessThanOrEqual(limits.init);
    expect(max.run).toBeLessThanOrEqual(limits.run);
    expect(max.eval).toBeLessThanOrEqual(limits.eval);
    // The limits are reached (the test really loaded each stage) and the stages worked side by side.
    expect(max).toEqual(limits);
    expect(maxTotal).toBeGreaterThan(limits.run);
    for (const snapshot of statsSeen) {
      for (const s of snapshot) expect(s.active, `${s.stage} active`).toBeLessThanOrEqual(s.concurrency);
    }
    expect(r.delivered.map((d) => d.trajectory.status)).toEqual(samples.map(() => S.TRAJECTORY_STATUS_COMPLETED));
    expect(r.pipeline.inFlight).toBe(0);
  });

  it('keeps init working while run is full, up to the stage permits (init + run + eval concurrency samples hold a sandbox)', async () => {
    const runGate = gate();
    const initDone = new Set<Sample>();
    const r = rig(
      {
        init: initWithSandbox(async (s) => void initDone.add(s)),
        run: async (s) => {
          await runGate.promise;
          s.run = fakeRunResult();
        },
      },
      { init: 2, run: 1, eval: 1 },
    );
    const samples = r.submit(...Array.from({ length: 6 }, (_, i) => r.sample(`sat-${i}`)));
    // 2 + 1 + 1 permits: four samples go through init while run is blocked; the other two wait before init (counted
    // as queued for it) holding no sandbox, instead of every admitted sample getting one.
    await eventually(() => initDone.size === 4, 'four samples through init while run is blocked');
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(initDone.size).toBe(4);
    const byStage = Object.fromEntries(r.pipeline.stageStats().map((s) => [s.stage, s]));
    expect(byStage.init).toMatchObject({ active: 0, queued: 2, concurrency: 2 });
    expect(byStage.run).toMatchObject({ active: 1, queued: 3, concurrency: 1 });
    expect(r.delivered).toHaveLength(0);
    runGate.open();
    await delivered(r, samples);
    expect(r.delivered.every((d) => d.trajectory.status === S.TRAJECTORY_STATUS_COMPLETED)).toBe(true);
  });
});

describe('Pipeline: timeouts', () => {
  it.each(STAGES)('the %s stage: a function that ignores its AbortSignal still ends as TIMEOUT at the stage deadline, and frees its slot', async (stage) => {
    const fns: Partial<StageFns> = stage === 'init' ? { init: initWithSandbox(forever) } : { init: initWithSandbox(), [stage]: forever };
    if (stage === 'eval') fns.run = async (s: Sample) => void (s.run = fakeRunResult());
    const r = rig(fns, { [stage]: 1 });
    const key = `${stage}TimeoutMs` as keyof ResolvedLimits;
    // Two samples, one slot: the second can only time out if the first's stuck call gave the slot back.
    const samples = r.submit(r.sample(`${stage}-stuck-a`, { [key]: 100 }), r.sample(`${stage}-stuck-b`, { [key]: 100 }));
    await delivered(r, samples);
    for (const { trajectory, sample } of r.delivered) {
      expect(trajectory.status).toBe(S.TRAJECTORY_STATUS_TIMEOUT);
      expect(trajectory.finishReason).toBe('timeout');
      expect(trajectory.error).toMatch(new RegExp(`${stage} stage timed out`));
      expect(trajectory.reward).toBe(0);
      expect(sample.releases).toBe(1);
      expect(sample.ownSandbox?.stops).toBe(1);
    }
  });

  it('the total timeout fires across stages even when every stage is within its own limit', async () => {
    const entered: string[] = [];
    const r = rig({
      // Init takes 150 ms ignoring its signal (under its own limit), then run never returns: only the total ends it.
      init: initWithSandbox(async (s) => {
        entered.push(`init:${s.key}`);
        await sleep(150);
      }),
      run: async (s) => {
        entered.push(`run:${s.key}`);
        await forever();
      },
    });
    const [sample] = r.submit(r.sample('total', { initTimeoutMs: 5_000, runTimeoutMs: 5_000, evalTimeoutMs: 5_000, totalTimeoutMs: 400 }));
    await delivered(r, [sample!]);
    const t = r.trajectoryOf(sample!)!;
    expect(entered).toEqual(['init:total#0', 'run:total#0']);
    expect(t.status).toBe(S.TRAJECTORY_STATUS_TIMEOUT);
    expect(t.finishReason).toBe('timeout');
    expect(t.error).toContain('total timeout');
    expect(sample!.releases).toBe(1);
    expect(sample!.ownSandbox?.stops).toBe(1);
  });

  it('a sample still waiting for a stage slot times out at its total deadline instead of waiting for the slot', async () => {
    const blocker = gate();
    const r = rig({ init: initWithSandbox(() => blocker.promise) }, { init: 1 });
    try {
      const [holder] = r.submit(r.sample('slot-holder'));
      const [waiting] = r.submit(r.sample('slot-waiter', { totalTimeoutMs: 200 }));
      // The holder keeps the only init slot for as long as the test likes; the waiter's 200 ms budget must still hold.
      await eventually(() => r.deliveriesOf(waiting!) > 0, 'the queued sample to time out at its total deadline', 3_000);
      const t = r.trajectoryOf(waiting!)!;
      expect(t.status).toBe(S.TRAJECTORY_STATUS_TIMEOUT);
      expect(t.finishReason).toBe('timeout');
      expect(r.deliveriesOf(holder!)).toBe(0);
    } finally {
      blocker.open();
    }
  });
});

describe('Pipeline: cancel', () => {
  it('cancelling a queued sample finishes it at once as CANCELLED, without running any stage', async () => {
    const blocker = gate();
    const initCalls: string[] = [];
    const r = rig({ init: initWithSandbox(async (s) => (initCalls.push(s.key), blocker.promise)) }, { init: 1 });
    const stagesOfQueued: string[] = [];
    const sub = r.pipeline.events$.subscribe((e) => e.type === 'stage' && e.sample.task.taskId === 'queued' && stagesOfQueued.push(e.stage));
    const [running, queued] = r.submit(r.sample('running'), r.sample('queued'));
    await eventually(() => initCalls.length === 1, 'the first sample in init');

    r.pipeline.cancel(queued!);
    // Finished without waiting for the init slot, which the other sample still holds.
    await eventually(() => r.deliveriesOf(queued!) === 1, 'the cancelled queued sample', 1_000);
    const t = r.trajectoryOf(queued!)!;
    expect(t.status).toBe(S.TRAJECTORY_STATUS_CANCELLED);
    expect(t.finishReason).toBe('cancelled');
    expect(t.reward).toBe(0);
    expect(r.pipeline.inFlight).toBe(1);

    blocker.open();
    await delivered(r, [running!]);
    expect(r.trajectoryOf(running!)!.status).toBe(S.TRAJECTORY_STATUS_COMPLETED);
    await sleep(20);
    expect(initCalls).toEqual(['running#0']);
    expect(stagesOfQueued).toEqual(['queued', 'done']);
    expect(r.deliveriesOf(queued!)).toBe(1);
    expect(queued!.releases).toBe(1);
    sub.unsubscribe();
  });

  it('a cancelled queued sample is no longer counted as queued in the stage stats', async () => {
    const blocker = gate();
    const r = rig({ init: initWithSandbox(() => blocker.promise) }, { init: 1 });
    try {
      const [, queued] = r.submit(r.sample('stats-running'), r.sample('stats-queued'));
      const initStats = (): StageStats => r.pipeline.stageStats().find((x) => x.stage === 'init')!;
      // A stage may start a loop turn later (the pipeline yields when the loop has been busy, see yield.ts).
      await eventually(() => initStats().active === 1, 'the first sample in its stage', 1_000);
      expect(initStats()).toMatchObject({ active: 1, queued: 1 });
      r.pipeline.cancel(queued!);
      await eventually(() => r.deliveriesOf(queued!) === 1, 'the cancelled sample', 1_000);
      // Watch's PoolStats reads these numbers: a sample that is gone must not show as waiting.
      expect(initStats()).toMatchObject({ active: 1, queued: 0 });
      expect(r.pipeline.inFlight).toBe(1);
    } finally {
      blocker.open();
    }
  });

  it('cancelling a running sample aborts the signal its stage function holds and ends it CANCELLED', async () => {
    let seen: AbortSignal | undefined;
    const r = rig({
      run: async (_s, signal) => {
        seen = signal;
        await abortableSleep(60_000, signal);
      },
    });
    const [sample] = r.submit(r.sample('cancel-running'));
    await eventually(() => seen !== undefined, 'the run stage to start');
    expect(seen!.aborted).toBe(false);
    r.pipeline.cancel(sample!);
    expect(seen!.aborted).toBe(true);
    expect(RolloutError.from(seen!.reason).code).toBe('cancelled');
    await delivered(r, [sample!]);
    const t = r.trajectoryOf(sample!)!;
    expect(t.status).toBe(S.TRAJECTORY_STATUS_CANCELLED);
    expect(t.finishReason).toBe('cancelled');
    expect(sample!.ownSandbox?.stops).toBe(1);
  });

  it('cancelling a sample waiting between stages releases the sandbox its init started', async () => {
    const runGate = gate();
    const inRun: string[] = [];
    const r = rig(
      {
        run: async (s) => {
          inRun.push(s.key);
          await runGate.promise;
          s.run = fakeRunResult();
        },
      },
      { run: 1 },
    );
    const [first, second] = r.submit(r.sample('between-a'), r.sample('between-b'));
    await eventually(() => inRun.length === 1 && second!.sandbox !== undefined && !second!.active, 'second sample queued for run');
    r.pipeline.cancel(second!);
    await eventually(() => r.deliveriesOf(second!) === 1, 'the cancelled sample', 1_000);
    expect(r.trajectoryOf(second!)!.status).toBe(S.TRAJECTORY_STATUS_CANCELLED);
    expect(second!.ownSandbox!.stops).toBe(1);
    runGate.open();
    await delivered(r, [first!]);
    await sleep(20);
    expect(inRun).toEqual(['between-a#0']);
  });
});

describe('Pipeline: the sandbox is released exactly once, before delivery, on every path', () => {
  const runOk: StageFn = async (s) => void (s.run = fakeRunResult());
  const boom = (code: 'sandbox_error' | 'backend_error' | 'environment_error'): StageFn => async () => {
    throw new RolloutError(code, 'injected');
  };
  interface Path {
    name: string;
    fns: Partial<StageFns>;
    limits?: Partial<ResolvedLimits>;
    concurrency?: Partial<Record<WorkStage, number>>;
    /** Runs before the sample under test is submitted (e.g. to fill a stage). */
    before?: (r: PipelineRig) => void;
    /** Runs against the sample under test once it is submitted. */
    act?: (r: PipelineRig, sample: CountingSample) => Promise<void>;
    status: TrajectoryStatus;
    /** Whether the path creates a sandbox (false when it ends before init). */
    sandbox?: boolean;
  }
  const started = new WeakSet<Sample>();
  const initBlocker = gate();
  const mark = (fn: StageFn): StageFn => async (s, signal) => {
    started.add(s);
    await fn(s, signal);
  };
  const paths: Path[] = [
    { name: 'success', fns: {}, status: S.TRAJECTORY_STATUS_COMPLETED },
    { name: 'init fails after starting the sandbox', fns: { init: initWithSandbox(boom('sandbox_error')) }, status: S.TRAJECTORY_STATUS_SANDBOX_ERROR },
    { name: 'init fails before any sandbox', fns: { init: boom('sandbox_error') }, status: S.TRAJECTORY_STATUS_SANDBOX_ERROR, sandbox: false },
    { name: 'run fails', fns: { run: boom('backend_error') }, status: S.TRAJECTORY_STATUS_BACKEND_ERROR },
    { name: 'eval fails', fns: { run: runOk, eval: boom('environment_error') }, status: S.TRAJECTORY_STATUS_ENVIRONMENT_ERROR },
    { name: 'init times out', fns: { init: initWithSandbox(forever) }, limits: { initTimeoutMs: 50 }, status: S.TRAJECTORY_STATUS_TIMEOUT },
    { name: 'run times out', fns: { run: forever }, limits: { runTimeoutMs: 50 }, status: S.TRAJECTORY_STATUS_TIMEOUT },
    { name: 'eval times out', fns: { run: runOk, eval: forever }, limits: { evalTimeoutMs: 50 }, status: S.TRAJECTORY_STATUS_TIMEOUT },
    { name: 'total timeout', fns: { run: forever }, limits: { totalTimeoutMs: 80 }, status: S.TRAJECTORY_STATUS_TIMEOUT },
    {
      name: 'cancel while running (stage ignores the signal)',
      fns: { run: mark(forever) },
      act: async (r, s) => {
        await eventually(() => started.has(s), 'run to start');
        r.pipeline.cancel(s);
      },
      status: S.TRAJECTORY_STATUS_CANCELLED,
    },
    {
      name: 'cancel twice, and again after the end',
      fns: { run: mark(forever) },
      act: async (r, s) => {
        await eventually(() => started.has(s), 'run to start');
        r.pipeline.cancel(s);
        r.pipeline.cancel(s);
        await eventually(() => r.deliveriesOf(s) > 0, 'delivery');
        r.pipeline.cancel(s);
      },
      status: S.TRAJECTORY_STATUS_CANCELLED,
    },
    {
      name: 'cancel while queued before init',
      // A blocker holds the only init slot, so the sample under test is still queued when it is cancelled.
      fns: { init: initWithSandbox(async (s) => (s.task.taskId === 'blocker' ? initBlocker.promise : undefined)) },
      concurrency: { init: 1 },
      before: (r) => void r.submit(r.sample('blocker')),
      act: async (r, s) => {
        expect(s.active).toBe(false);
        r.pipeline.cancel(s);
        await eventually(() => r.deliveriesOf(s) > 0, 'delivery while the blocker still holds init', 1_000);
        initBlocker.open();
      },
      status: S.TRAJECTORY_STATUS_CANCELLED,
      sandbox: false,
    },
    {
      name: 'pipeline stop while running',
      fns: { run: mark(forever) },
      act: async (r, s) => {
        await eventually(() => started.has(s), 'run to start');
        await r.pipeline.stop();
      },
      status: S.TRAJECTORY_STATUS_CANCELLED,
    },
  ];

  it.each(paths)('$name', async (path) => {
    const r = rig({ init: initWithSandbox(), ...path.fns }, path.concurrency);
    const sample = r.sample(`path-${path.name}`, path.limits);
    path.before?.(r);
    r.submit(sample);
    if (path.act) await path.act(r, sample);
    await delivered(r, [sample], 3_000);
    await sleep(30); // a late second release would show up here
    const t = r.trajectoryOf(sample)!;
    expect(TrajectoryStatus[t.status]).toBe(TrajectoryStatus[path.status]);
    expect(r.deliveriesOf(sample)).toBe(1);
    expect(sample.releases).toBe(1);
    if (path.sandbox === false) {
      expect(sample.ownSandbox).toBeUndefined();
    } else {
      expect(sample.ownSandbox?.stops).toBe(1);
      expect(sample.stopsAtDelivery, 'sandbox stopped before the trajectory was delivered').toBe(1);
    }
    expect(r.pipeline.inFlight).toBe(0);
  });
});

describe('Pipeline: delivery order', () => {
  it('delivers trajectories in completion order, not submission order', async () => {
    const gates = new Map<string, Gate>();
    const r = rig({
      run: async (s) => {
        const g = gate();
        gates.set(s.task.taskId, g);
        await g.promise;
        s.run = fakeRunResult();
      },
    });
    const samples = r.submit(...['s0', 's1', 's2', 's3', 's4'].map((id) => r.sample(id)));
    await eventually(() => gates.size === 5, 'every sample in run');
    const finishOrder = ['s3', 's0', 's4', 's1', 's2'];
    for (const [i, id] of finishOrder.entries()) {
      gates.get(id)!.open();
      await eventually(() => r.delivered.length === i + 1, `delivery of ${id}`);
    }
    await delivered(r, samples);
    expect(r.delivered.map((d) => d.trajectory.taskId)).toEqual(finishOrder);
  });
});

describe('Pipeline: failures map to trajectory statuses, never to COMPLETED with reward 0', () => {
  const runOk: StageFn = async (s) => void (s.run = fakeRunResult());
  const cases: [string, WorkStage, unknown, TrajectoryStatus][] = [
    ['sandbox_error in init', 'init', new RolloutError('sandbox_error', 'bwrap died'), S.TRAJECTORY_STATUS_SANDBOX_ERROR],
    ['sandbox_error in run (sandbox died mid-episode)', 'run', new RolloutError('sandbox_error', 'sandbox stopped'), S.TRAJECTORY_STATUS_SANDBOX_ERROR],
    ['backend_error in run', 'run', new RolloutError('backend_error', 'vLLM answered HTTP 500'), S.TRAJECTORY_STATUS_BACKEND_ERROR],
    ['environment_error in init', 'init', new RolloutError('environment_error', 'setup script failed'), S.TRAJECTORY_STATUS_ENVIRONMENT_ERROR],
    ['environment_error in eval', 'eval', new RolloutError('environment_error', 'grader crashed'), S.TRAJECTORY_STATUS_ENVIRONMENT_ERROR],
    ['a plain Error in eval', 'eval', new Error('grader bug'), S.TRAJECTORY_STATUS_ENVIRONMENT_ERROR],
    ['a TypeError in run', 'run', new TypeError('x is not a function'), S.TRAJECTORY_STATUS_ENVIRONMENT_ERROR],
    ['a thrown string in init', 'init', 'string failure', S.TRAJECTORY_STATUS_ENVIRONMENT_ERROR],
  ];

  it.each(cases)('%s', async (_name, stage, thrown, status) => {
    const throwing: StageFn = async () => {
      throw thrown;
    };
    const fns: Partial<StageFns> = { run: runOk, [stage]: stage === 'init' ? initWithSandbox(throwing) : throwing };
    const r = rig(fns);
    const [sample] = r.submit(r.sample(`err-${stage}`));
    await delivered(r, [sample!]);
    const t = r.trajectoryOf(sample!)!;
    expect(TrajectoryStatus[t.status]).toBe(TrajectoryStatus[status]);
    expect(t.status).not.toBe(S.TRAJECTORY_STATUS_COMPLETED);
    expect(t.reward).toBe(0);
    expect(t.rewardDetails).toEqual({});
    expect(t.finishReason).toBe('error');
    expect(t.error).toContain(thrown instanceof Error ? thrown.message : String(thrown));
    expect(sample!.ownSandbox?.stops).toBe(1);
    // The run's tokens are kept when the failure came after it (eval), for debugging.
    expect(t.responseTokenIds).toEqual(stage === 'eval' ? [4] : []);
  });

  it('an eval that returns without an evaluation is an ENVIRONMENT_ERROR, not a COMPLETED reward 0', async () => {
    const r = rig({ eval: async () => undefined });
    const [sample] = r.submit(r.sample('no-eval'));
    await delivered(r, [sample!]);
    const t = r.trajectoryOf(sample!)!;
    expect(t.status).toBe(S.TRAJECTORY_STATUS_ENVIRONMENT_ERROR);
    expect(t.reward).toBe(0);
  });

  it('a throw while building one trajectory fails that sample (ENVIRONMENT_ERROR); the line goes on', async () => {
    const r = rig({
      run: async (sample) => {
        const result = fakeRunResult();
        // A run result whose turns cannot be mapped: buildTrajectory throws for this sample only.
        if (sample.task.taskId === 'unbuildable') result.tokens.turns = null as unknown as typeof result.tokens.turns;
        sample.run = result;
      },
    });
    const [bad, good] = r.submit(r.sample('unbuildable'), r.sample('buildable'));
    await delivered(r, [bad!, good!]);
    const t = r.trajectoryOf(bad!)!;
    expect(t.status).toBe(S.TRAJECTORY_STATUS_ENVIRONMENT_ERROR);
    expect(t.error).toContain('building the trajectory failed');
    expect(bad!.ownSandbox?.stops).toBe(1);
    expect(r.trajectoryOf(good!)!.status).toBe(S.TRAJECTORY_STATUS_COMPLETED);
    // The line still takes work after the failure.
    const [later] = r.submit(r.sample('after-unbuildable'));
    await delivered(r, [later!]);
    expect(r.trajectoryOf(later!)!.status).toBe(S.TRAJECTORY_STATUS_COMPLETED);
  });

  it('a success carries the run tokens, the reward, metadata and timing', async () => {
    const r = rig();
    const [sample] = r.submit(r.sample('ok'));
    await delivered(r, [sample!]);
    const t = r.trajectoryOf(sample!)!;
    expect(t).toMatchObject({ status: S.TRAJECTORY_STATUS_COMPLETED, finishReason: 'answer', reward: 1, numTurns: 1, metadata: { origin: 'pipeline-test' } });
    expect(t.responseTokenIds).toEqual([4]);
    expect(t.timing!.totalMs).toBeGreaterThan(0);
  });
});
