import { afterEach, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { parseConfig } from '../../src/config.js';
import type { Environment, OpenSandbox } from '../../src/environments/types.js';
import { RolloutError } from '../../src/errors.js';
import { silentLogger } from '../../src/observability/logger.js';
import { createStages } from '../../src/pipeline/stages.js';
import type { RuntimeDeps } from '../../src/runtime.js';
import type { Sandbox, SandboxDriver, SandboxSpec } from '../../src/sandboxes/types.js';
import { eventually } from '../support/wait.js';
import { CountingSample, CountingSandbox, fakeEnvironment, fakeTask, PipelineRig } from '../support/pipeline-fixtures.js';

/** A driver of counting sandboxes that records the specs it was asked for; `failNext` makes one start throw. */
class CountingDriver implements SandboxDriver {
  readonly name = 'counting';
  readonly started: { spec: SandboxSpec; sandbox: CountingSandbox }[] = [];
  failNext: Error | undefined;
  /** Resolves a start only when the test says so (to race it against the sample's end). */
  gate: Promise<void> | undefined;

  async start(spec: SandboxSpec): Promise<Sandbox> {
    await this.gate;
    if (this.failNext) {
      const err = this.failNext;
      this.failNext = undefined;
      throw err;
    }
    const sandbox = new CountingSandbox(`eval-${this.started.length}`);
    this.started.push({ spec, sandbox });
    return sandbox;
  }
}

/** An environment whose evaluate opens `count` extra sandboxes and then does `then`. */
function opener(count: number, then: (opened: Sandbox[]) => Promise<void> = async () => undefined): Environment {
  return {
    ...fakeEnvironment,
    sandbox: () => ({ image: '/images/task.sif', limits: { memoryMb: 3000 } }),
    async evaluate({ openSandbox }) {
      const opened: Sandbox[] = [];
      for (let i = 0; i < count; i++) opened.push(await (openSandbox as OpenSandbox)());
      await then(opened);
      return { reward: 1, details: {}, report: {} };
    },
  };
}

describe('Environment.evaluate openSandbox (an extra sandbox owned by the pipeline)', () => {
  let rig: PipelineRig | undefined;
  afterEach(async () => rig?.stop());

  function setup(environment: Environment, evalTimeoutMs = 30_000): { driver: CountingDriver; sample: CountingSample } {
    const driver = new CountingDriver();
    const deps = { config: parseConfig({ sandbox: { imageDirs: ['/images'] } }), sandboxes: driver, logger: silentLogger() } as unknown as RuntimeDeps;
    rig = new PipelineRig({ eval: createStages(deps).eval });
    const sample: CountingSample = new CountingSample(fakeTask('t', { evalTimeoutMs }, { environment }), 0, (trajectory) => rig!.delivered.push({ sample, trajectory }));
    rig.submit(sample);
    return { driver, sample };
  }

  it("resolves the extra sandbox like the sample's own (the instance's image and limits, no network) and stops it when evaluate returns", async () => {
    const { driver, sample } = setup(opener(2));
    await eventually(() => rig!.trajectoryOf(sample) !== undefined, 'the trajectory');
    expect(rig!.trajectoryOf(sample)!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
    expect(driver.started).toHaveLength(2);
    for (const { spec, sandbox } of driver.started) {
      expect(spec).toMatchObject({ image: '/images/task.sif', network: false, limits: { memoryMb: 3000 } });
      expect(spec.limits.wallClockMs).toBeLessThanOrEqual(60_000); // bounded by the task's total timeout
      expect(sandbox.stops).toBe(1);
    }
  });

  it("stops it when evaluate throws, and the failure is the environment's", async () => {
    const { driver, sample } = setup(opener(1, async () => Promise.reject(new Error('grader crashed'))));
    await eventually(() => rig!.trajectoryOf(sample) !== undefined, 'the trajectory');
    const t = rig!.trajectoryOf(sample)!;
    expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR);
    expect(t.error).toContain('grader crashed');
    expect(driver.started[0]!.sandbox.stops).toBe(1);
  });

  it('stops it when the eval stage times out while evaluate still holds it', async () => {
    const { driver, sample } = setup(
      opener(1, () => new Promise(() => undefined)),
      200,
    );
    await eventually(() => rig!.trajectoryOf(sample) !== undefined, 'the trajectory');
    expect(rig!.trajectoryOf(sample)!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_TIMEOUT);
    expect(driver.started[0]!.sandbox.stops).toBe(1);
  });

  it('reports a sandbox that cannot start as SANDBOX_ERROR, not as reward 0', async () => {
    const environment = opener(1);
    const { driver, sample } = setup(environment);
    driver.failNext = new RolloutError('sandbox_error', 'image is not a SIF');
    await eventually(() => rig!.trajectoryOf(sample) !== undefined, 'the trajectory');
    const t = rig!.trajectoryOf(sample)!;
    expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_SANDBOX_ERROR);
    expect(t.error).toContain('image is not a SIF');
  });

  it('stops a sandbox whose start finishes after the sample was cancelled', async () => {
    let open!: () => void;
    const environment = opener(1);
    const { driver, sample } = setup(environment);
    driver.gate = new Promise((resolve) => (open = resolve));
    await eventually(() => sample.stage === 'eval', 'the eval stage');
    sample.abort('cancelled', 'cancelled by test');
    await eventually(() => rig!.trajectoryOf(sample) !== undefined, 'the trajectory');
    expect(rig!.trajectoryOf(sample)!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED);
    open();
    await eventually(() => driver.started.length === 1 && driver.started[0]!.sandbox.stops === 1, 'the late sandbox stopped');
  });
});
