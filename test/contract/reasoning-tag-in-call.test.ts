import { afterEach, describe, expect, it } from 'vitest';
import { Role, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { hermesToolCall, type FakePolicy } from '../../src/testing/scripted-policy.js';
import { collect, invariantViolations, mathTask, startHarness, type Harness } from '../support/harness.js';

async function runOne(h: Harness, taskId: string): Promise<Trajectory> {
  const session = h.client.openSession();
  await session.submit(mathTask(taskId, 1, 1, { includeMessages: true }));
  session.close();
  const [t] = await collect(session.trajectories());
  expect(invariantViolations(t!)).toEqual([]);
  return t!;
}

// Regression (tokens review, 2026-12-02): a tool call mentioning "<think>" in its arguments was read as no call, and the
// episode ended COMPLETED with finish_reason 'answer' and the tool never run.
describe('the agent loop with a tool call that mentions a reasoning tag in its arguments', () => {
  let h: Harness | undefined;
  afterEach(async () => {
    await h?.close();
    h = undefined;
  });

  it('runs the call (a tool turn follows) instead of ending the episode as a plain answer', async () => {
    const policy: FakePolicy = (prompt) =>
      prompt.includes('<tool_response>') ? '\\boxed{0}' : hermesToolCall('python', { code: "print('<think>' in 'no tags here')" });
    h = await startHarness({}, { policy });
    const t = await runOne(h, 'think-in-args');
    // The call ran: a tool turn follows it, and the episode's answer is the one given after the tool's response.
    expect(t.turns.map((x) => x.role)).toContain(Role.ROLE_TOOL);
    expect(t.numTurns).toBeGreaterThanOrEqual(2);
  });
});
