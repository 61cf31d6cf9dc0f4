import { afterEach, expect, it } from 'vitest';
import { Role, TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { hermesToolCall, type FakePolicy } from '../../src/testing/scripted-policy.js';
import { collect, mathTask, startHarness, type Harness } from '../support/harness.js';

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

/**
 * max_total_tokens is the budget of prompt + response (rollout.proto): what a tool prints counts too. An observation
 * that would cross it is not appended; the trajectory ends TRUNCATED (max_total_tokens) within its budget. Found by
 * review (an observation used to be appended whole and the budget checked only at the next turn).
 */
it('never exceeds max_total_tokens, also when a tool observation crosses it', async () => {
  const verbose: FakePolicy = () => hermesToolCall('python', { code: 'print("lorem ipsum dolor " * 400)' });
  h = await startHarness({}, { policy: verbose });
  const session = h.client.openSession();
  await session.submit(mathTask('budget-obs', 1, 1, { sampling: { maxTokensPerTurn: 100, maxTotalTokens: 1200, stop: [] } }));
  session.close();
  const [t] = (await collect(session.trajectories())) as Trajectory[];
  expect(t!.promptTokenIds.length + t!.responseTokenIds.length).toBeLessThanOrEqual(1200);
  expect([TrajectoryStatus[t!.status], t!.finishReason]).toEqual(['TRAJECTORY_STATUS_TRUNCATED', 'max_total_tokens']);
  expect(t!.turns.at(-1)!.role).toBe(Role.ROLE_ASSISTANT); // the call whose output did not fit ends it
});
