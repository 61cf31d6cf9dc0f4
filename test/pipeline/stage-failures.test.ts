import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect } from '../support/harness.js';
import { limits } from '../support/server-harness.js';
import { probeTask, startProbe, type ProbeHarness, type ProbeInstance } from '../support/probe-environment.js';

const S = TrajectoryStatus;
let h: ProbeHarness;
beforeAll(async () => {
  h = await startProbe({ config: { init: { concurrency: 1 }, eval: { concurrency: 1 }, run: { concurrency: 1 } } });
});
afterAll(async () => h?.close());

const cases: [string, Omit<ProbeInstance, 'key'>, string, RegExp][] = [
  ['init-throw', { init: 'throw' }, 'ENVIRONMENT_ERROR', /init threw/],
  ['init-hang', { init: 'hang' }, 'TIMEOUT', /init stage timed out/],
  ['init-stuck', { init: 'stuck' }, 'TIMEOUT', /init stage timed out/],
  ['run-tool-hang', { run: 'tool:forever' }, 'TIMEOUT', /run stage timed out/],
  ['eval-throw', { eval: 'throw' }, 'ENVIRONMENT_ERROR', /eval threw/],
  ['eval-hang', { eval: 'hang' }, 'TIMEOUT', /eval stage timed out/],
  ['eval-stuck', { eval: 'stuck' }, 'TIMEOUT', /eval stage timed out/],
];

describe('an environment that throws or hangs in each stage (one slot per stage: a stuck one must free it)', () => {
  it('every failure is its own filterable status with the cause, never reward-0 COMPLETED, and the line keeps moving', async () => {
    const session = h.client.openSession();
    for (const [id, inst] of cases) {
      await session.submit(probeTask(id, inst, { limits: limits({ initTimeoutMs: 300, runTimeoutMs: 300, evalTimeoutMs: 300 }) }));
    }
    await session.submit(probeTask('after', {}));
    session.close();
    const got = await collect(session.trajectories());
    const by = new Map(got.map((t: Trajectory) => [t.taskId, t]));
    for (const [id, , status, error] of cases) {
      const t = by.get(id)!;
      expect(S[t.status], `${id}: ${t.error}`).toBe(`TRAJECTORY_STATUS_${status}`);
      expect(t.error).toMatch(error);
      expect(t.reward).toBe(0);
    }
    expect(S[by.get('after')!.status]).toBe('TRAJECTORY_STATUS_COMPLETED');
    expect(h.driver.live).toBe(0);
    expect(h.server.runtime.pipeline.inFlight).toBe(0);
  });
});
