import { afterEach, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

/**
 * A context-length refusal is the policy running out of room (TRUNCATED, a policy outcome the trainer scores) and
 * teaches the pool the engine's limit. An engine (or a gateway in front of it) that answers one the request cannot
 * have caused — a canned error, another request's refusal — must fail the sample as BACKEND_ERROR and teach nothing.
 */
const describeT = (t: Trajectory): string => `${TrajectoryStatus[t.status]} ${t.finishReason} ${t.error}`;

let h: ServerHarness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

async function runOne(harness: ServerHarness, taskId: string, seed: number): Promise<Trajectory> {
  const session = harness.client.openSession();
  await session.submit(mathTask(taskId, 1, seed));
  session.close();
  const [t] = await collect(session.trajectories());
  return t!;
}

describe('a context-length refusal the request cannot have caused', () => {
  it('one counting another prompt length (7 tokens) is BACKEND_ERROR, not TRUNCATED, and the pool keeps its limit', async () => {
    h = await startServerHarness();
    h.engine.failNext(1, {
      kind: 'status',
      status: 400,
      message: "This model's maximum context length is 100 tokens. However, you requested 263 tokens (7 in the messages, 256 in the completion). Please reduce the length of the messages or completion.",
    });
    const t = await runOne(h, 'foreign-overflow', 5501);
    expect(TrajectoryStatus[t.status], describeT(t)).toBe('TRAJECTORY_STATUS_BACKEND_ERROR');
    expect(t.error).toMatch(/7 prompt tokens/);
    expect(invariantViolations(t)).toEqual([]);
    // The bogus limit of 100 was not learned: the next trajectory on the same engine completes normally.
    const next = await runOne(h, 'after-foreign-overflow', 5502);
    expect(TrajectoryStatus[next.status], describeT(next)).toBe('TRAJECTORY_STATUS_COMPLETED');
    const [backend] = await h.client.listBackends();
    expect(backend!.maxModelLen).toBe(40960);
  });

  it('one whose stated limit the request fits (prompt + max_tokens <= it) is BACKEND_ERROR, not TRUNCATED', async () => {
    h = await startServerHarness();
    const refusal = { kind: 'status', status: 400, message: "This model's maximum context length is 40960 tokens. Please reduce the length of the messages or completion." } as const;
    h.engine.failNext(2, refusal);
    const t = await runOne(h, 'fitting-overflow', 5503);
    expect(TrajectoryStatus[t.status], describeT(t)).toBe('TRAJECTORY_STATUS_BACKEND_ERROR');
    expect(t.error).toMatch(/fit/);
    expect(invariantViolations(t)).toEqual([]);
  });
});
