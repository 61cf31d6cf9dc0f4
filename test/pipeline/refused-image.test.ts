import { afterEach, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { parseConfig } from '../../src/config.js';
import type { Environment } from '../../src/environments/types.js';
import { silentLogger } from '../../src/observability/logger.js';
import { createStages } from '../../src/pipeline/stages.js';
import type { RuntimeDeps } from '../../src/runtime.js';
import type { Sandbox, SandboxDriver, SandboxSpec } from '../../src/sandboxes/types.js';
import { eventually } from '../support/wait.js';
import { CountingSample, CountingSandbox, fakeEnvironment, fakeTask, PipelineRig } from '../support/pipeline-fixtures.js';

/** A driver double that records the specs it was asked to start. */
class RecordingDriver implements SandboxDriver {
  readonly name = 'recording';
  readonly specs: SandboxSpec[] = [];

  async start(spec: SandboxSpec): Promise<Sandbox> {
    this.specs.push(spec);
    return new CountingSandbox(`sbx-${this.specs.length}`);
  }
}

// An image outside sandbox.imageDirs that reaches the pipeline (a task journaled before the operator narrowed the
// dirs, or an evaluate that opens a sandbox on another image) is the task's fault: INVALID_TASK, nothing started.
describe('a sandbox image outside sandbox.imageDirs in the pipeline', () => {
  let rig: PipelineRig | undefined;
  afterEach(async () => rig?.stop());

  function run(environment: Environment): { driver: RecordingDriver; sample: CountingSample } {
    const driver = new RecordingDriver();
    const deps = { config: parseConfig({ sandbox: { image: '/srv/images/default.sif' } }), sandboxes: driver, logger: silentLogger() } as unknown as RuntimeDeps;
    const stages = createStages(deps);
    rig = new PipelineRig({ init: stages.init, eval: stages.eval });
    const sample: CountingSample = new CountingSample(fakeTask('t', {}, { environment }), 0, (trajectory) => rig!.delivered.push({ sample, trajectory }));
    rig.submit(sample);
    return { driver, sample };
  }

  it('ends the sample INVALID_TASK naming sandbox.imageDirs when its own sandbox would be the host ("host")', async () => {
    const { driver, sample } = run({ ...fakeEnvironment, sandbox: () => ({ image: 'host' }) });
    await eventually(() => rig!.trajectoryOf(sample) !== undefined, 'the trajectory');
    const t = rig!.trajectoryOf(sample)!;
    expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_INVALID_TASK);
    expect(t.error).toContain('sandbox.imageDirs');
    expect(driver.specs).toEqual([]);
  });

  it('ends it INVALID_TASK when evaluate opens a grading sandbox on "/"', async () => {
    const environment: Environment = {
      ...fakeEnvironment,
      async evaluate({ openSandbox }) {
        await openSandbox!({ image: '/' });
        return { reward: 1, details: {}, report: {} };
      },
    };
    const { driver, sample } = run(environment);
    await eventually(() => rig!.trajectoryOf(sample) !== undefined, 'the trajectory');
    const t = rig!.trajectoryOf(sample)!;
    expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_INVALID_TASK);
    expect(t.error).toContain('sandbox.imageDirs');
    expect(driver.specs).toHaveLength(1); // the sample's own sandbox, not the refused one
  });
});
