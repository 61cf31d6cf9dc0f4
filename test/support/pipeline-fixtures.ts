import type { Environment } from '../../src/environments/types.js';
import { silentLogger } from '../../src/observability/logger.js';
import { Pipeline, type StageFns } from '../../src/pipeline/pipeline.js';
import { Sample, type RunResult } from '../../src/pipeline/sample.js';
import type { ResolvedLimits, ResolvedTask } from '../../src/pipeline/task.js';
import type { ExecResult } from '../../src/sandboxes/types.js';
import { NullSandbox } from '../../src/testing/null-sandbox.js';
import { testSpec } from '../sandboxes/helpers.js';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';

type WorkStage = 'init' | 'run' | 'eval';

/** The smallest environment the pipeline accepts; the stage functions under test never call into it. */
export const fakeEnvironment: Environment = {
  name: 'fake-env',
  description: 'pipeline test double',
  instanceSchema: { type: 'object' },
  validate: (x) => x,
  init: async () => ({ messages: [{ role: 'user', content: 'hi' }] }),
  tools: () => [],
  evaluate: async () => ({ reward: 1, details: {}, report: {} }),
};

const GENEROUS: ResolvedLimits = { maxTurns: 4, initTimeoutMs: 30_000, runTimeoutMs: 30_000, evalTimeoutMs: 30_000, totalTimeoutMs: 60_000 };

/** A resolved task as validateTask would produce it, with limits overridable. */
export function fakeTask(taskId: string, limits: Partial<ResolvedLimits> = {}, extra: Partial<ResolvedTask> = {}): ResolvedTask {
  return {
    taskId,
    groupId: `group-${taskId}`,
    numSamples: 1,
    environment: fakeEnvironment,
    instance: {},
    sampling: { maxTokensPerTurn: 16, maxTotalTokens: 64, stop: [] },
    limits: { ...GENEROUS, ...limits },
    metadata: { origin: 'pipeline-test' },
    includeMessages: false,
    fingerprint: taskId,
    ...extra,
  };
}

/** A sandbox that only counts `stop` calls (the resource the pipeline must release exactly once). */
export class CountingSandbox extends NullSandbox {
  stops = 0;

  constructor(id: string) {
    super(id, testSpec());
  }

  override async exec(): Promise<ExecResult> {
    return { exitCode: 0, signal: null, stdout: '', stderr: '', timedOut: false, truncated: false, durationMs: 0 };
  }

  override async stop(): Promise<void> {
    this.stops++;
  }
}

/** A Sample that counts `release` calls, so a test can assert "exactly once" on every path, sandbox or not. */
export class CountingSample extends Sample {
  releases = 0;
  /** The sandbox's stop count when the trajectory reached the sink (release must come before delivery). */
  stopsAtDelivery: number | undefined;
  ownSandbox: CountingSandbox | undefined;

  override async release(): Promise<void> {
    this.releases++;
    return super.release();
  }
}

/** A run result with one sampled token: enough for buildTrajectory to make a COMPLETED trajectory. */
export function fakeRunResult(): RunResult {
  return {
    outcome: { messages: [], finishReason: 'answer' },
    tokens: {
      promptIds: [1, 2, 3],
      responseIds: [4],
      mask: [1],
      logprobs: [-0.5],
      turns: [{ role: 'assistant', start: 0, end: 1 }],
      messages: [],
      policyVersionMin: 0,
      policyVersionMax: 0,
      totalTokens: 4,
    },
    truncated: false,
    numTurns: 1,
  };
}

/** Stage functions that do the minimum a real stage does: init starts a sandbox, run records a result, eval a reward. */
export function happyStages(): StageFns {
  return {
    init: async (sample) => {
      const sandbox = new CountingSandbox(`sbx-${sample.key}`);
      if (sample instanceof CountingSample) sample.ownSandbox = sandbox;
      sample.sandbox = sandbox;
    },
    run: async (sample) => {
      sample.run = fakeRunResult();
    },
    eval: async (sample) => {
      sample.evaluation = { reward: 1, details: { correct: 1 }, report: {} };
    },
  };
}

/** A delivered trajectory with the sample it belongs to, in delivery order. */
export interface Delivery {
  sample: CountingSample;
  trajectory: Trajectory;
}

/**
 * A started Pipeline with the given stage functions (defaults: `happyStages`) and concurrency, plus helpers to
 * make counting samples and read deliveries in the order the pipeline made them.
 */
export class PipelineRig {
  readonly pipeline: Pipeline;
  readonly delivered: Delivery[] = [];

  constructor(fns: Partial<StageFns> = {}, concurrency: Partial<Record<WorkStage, number>> = {}) {
    const stages = { ...happyStages(), ...fns };
    this.pipeline = new Pipeline(
      stages,
      { init: { concurrency: concurrency.init ?? 8 }, run: { concurrency: concurrency.run ?? 8 }, eval: { concurrency: concurrency.eval ?? 8 } },
      silentLogger(),
    );
    this.pipeline.start();
  }

  /** A counting sample of a one-sample task; not yet submitted. */
  sample(taskId: string, limits: Partial<ResolvedLimits> = {}): CountingSample {
    const task = fakeTask(taskId, limits);
    const sample: CountingSample = new CountingSample(task, 0, (trajectory) => {
      sample.stopsAtDelivery = sample.ownSandbox?.stops;
      this.delivered.push({ sample, trajectory });
    });
    return sample;
  }

  submit(...samples: CountingSample[]): CountingSample[] {
    this.pipeline.submit(samples);
    return samples;
  }

  trajectoryOf(sample: Sample): Trajectory | undefined {
    return this.delivered.find((d) => d.sample === sample)?.trajectory;
  }

  deliveriesOf(sample: Sample): number {
    return this.delivered.filter((d) => d.sample === sample).length;
  }

  async stop(): Promise<void> {
    await this.pipeline.stop();
  }
}
