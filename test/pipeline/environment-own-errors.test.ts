import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect } from '../support/harness.js';
import { probeTask, startProbe, type ProbeHarness } from '../support/probe-environment.js';

const S = TrajectoryStatus;
let h: ProbeHarness;
beforeAll(async () => {
  h = await startProbe();
});
afterAll(async () => h?.close());

async function one(taskId: string, inst: Parameters<typeof probeTask>[1]): Promise<Trajectory> {
  const session = h.client.openSession();
  await session.submit(probeTask(taskId, inst));
  session.close();
  return (await collect(session.trajectories()))[0]!;
}

// Regression (pipeline review, 2026-12-02): errors were classified by name, so an environment's own AbortError or
// TimeoutError (a grader call with its own deadline) became CANCELLED or TIMEOUT, as if the sample had been cancelled
// or run out of time. Only the sample's signal says that (errors.ts classifyThrown).
describe("an environment's own timeouts and aborts are its failures, not the sample's deadline or a cancel", () => {
  it('evaluate whose call to a grader service hits its own AbortSignal.timeout is ENVIRONMENT_ERROR, not TIMEOUT', async () => {
    const t = await one('grader-timeout', { eval: 'throw-own-timeout' });
    // Nothing timed out in the pipeline: the stage budgets are the defaults (60 s) and the sample ran for ms.
    expect(t.timing!.totalMs).toBeLessThan(10_000);
    expect(S[t.status], `${t.finishReason} ${t.error}`).toBe('TRAJECTORY_STATUS_ENVIRONMENT_ERROR');
  });

  it('init that throws an AbortError of its own (nobody cancelled the sample) is ENVIRONMENT_ERROR, not CANCELLED', async () => {
    const t = await one('init-own-abort', { init: 'throw-own-abort' });
    expect(S[t.status], `${t.finishReason} ${t.error}`).toBe('TRAJECTORY_STATUS_ENVIRONMENT_ERROR');
  });
});
