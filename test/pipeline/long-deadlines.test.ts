import { afterEach, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect } from '../support/harness.js';
import { limits } from '../support/server-harness.js';
import { probeTask, startProbe, type ProbeHarness } from '../support/probe-environment.js';
import { eventually } from '../support/wait.js';

const S = TrajectoryStatus;
const show = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex} ${S[t.status]} ${t.error} (total ${t.timing?.totalMs.toFixed(1)} ms)`;

const harnesses: ProbeHarness[] = [];
afterEach(async () => {
  for (const h of harnesses.splice(0)) await h.close();
});

async function run(h: ProbeHarness, task: Parameters<typeof probeTask>[0], inst = {}, extra = {}): Promise<Trajectory[]> {
  const session = h.client.openSession();
  await session.submit(probeTask(task, inst, extra));
  session.close();
  return collect(session.trajectories());
}

// Regression (pipeline review, 2026-12-02): Node fires a timer of more than 2^31 - 1 ms after 1 ms. A total derived from
// an environment's stage budgets plus a task's INT32_MAX run budget timed the sample out at once; configured timeouts
// past it did the same (now refused at start, naming the field).
describe('deadlines longer than a Node timer can wait', () => {
  it('smoke: a probe task completes', async () => {
    const h = await startProbe();
    harnesses.push(h);
    const [t] = await run(h, 'smoke');
    expect(S[t!.status], show(t!)).toBe('TRAJECTORY_STATUS_COMPLETED');
  });

  it('a task on an environment with stage budgets that gives a long run_timeout_ms (no total) is not timed out at once', async () => {
    // The environment declares stage budgets (as swe does), so the total defaults to init + run + eval. The trainer
    // gives its run stage the longest budget the field can carry (INT32_MAX ms ≈ 24.8 days, "no limit"); every
    // value is a valid int32 and accepted. The derived total is > 2^31-1 ms, which setTimeout turns into 1 ms.
    const h = await startProbe({ stageTimeouts: { evalMs: 60_000 } });
    harnesses.push(h);
    const [t] = await run(h, 'long-run-budget', {}, { limits: limits({ runTimeoutMs: 2_147_483_647 }) });
    expect(S[t!.status], show(t!)).toBe('TRAJECTORY_STATUS_COMPLETED');
  });

  it('a server configured with a stage timeout past 2^31-1 ms either refuses to start naming it or honours it', async () => {
    // A 30-day run budget ("effectively none" for a week-long training run).
    let h: ProbeHarness;
    try {
      h = await startProbe({ config: { run: { timeoutMs: 30 * 24 * 3600 * 1000 } } });
    } catch (err) {
      expect(String(err)).toMatch(/run\.timeoutMs/);
      return;
    }
    harnesses.push(h);
    const [t] = await run(h, 'config-run-timeout');
    expect(S[t!.status], show(t!)).toBe('TRAJECTORY_STATUS_COMPLETED');
  });

  it('a server configured with defaults.totalTimeoutMs past 2^31-1 ms either refuses to start naming it or honours it', async () => {
    let h: ProbeHarness;
    try {
      h = await startProbe({ config: { defaults: { totalTimeoutMs: 30 * 24 * 3600 * 1000 } } });
    } catch (err) {
      expect(String(err)).toMatch(/totalTimeoutMs/);
      return;
    }
    harnesses.push(h);
    const [t] = await run(h, 'config-total-timeout');
    expect(S[t!.status], show(t!)).toBe('TRAJECTORY_STATUS_COMPLETED');
  });

  it('a server configured with a drain grace past 2^31-1 ms either refuses to start naming it or gives the work in flight that grace', async () => {
    let h: ProbeHarness;
    try {
      h = await startProbe({ config: { drainGraceMs: 30 * 24 * 3600 * 1000 } });
    } catch (err) {
      expect(String(err)).toMatch(/drainGraceMs/);
      return;
    }
    harnesses.push(h);
    const session = h.client.openSession({ autoAck: false });
    const got: Trajectory[] = [];
    const iterated = (async () => {
      try {
        for await (const t of session.trajectories()) got.push(t);
      } catch {
        // the drained stream ends UNAVAILABLE
      }
    })();
    await session.submit(probeTask('drain-grace', { run: 'tool:drain-grace-gate' }));
    await eventually(() => h.state.count('drain-grace-gate', 'tool', 'enter') === 1, 'the sample in its run stage');
    const drained = h.server.drain(); // the configured grace: 30 days
    await new Promise((r) => setTimeout(r, 500));
    h.state.open('drain-grace-gate');
    await drained;
    await iterated;
    expect(got.map(show)).toHaveLength(1);
    expect(S[got[0]!.status], show(got[0]!)).toBe('TRAJECTORY_STATUS_COMPLETED');
  });
});
