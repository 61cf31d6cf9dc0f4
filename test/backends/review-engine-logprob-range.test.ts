import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { checkSampledTokens, CompletionRejected } from '../../src/backends/completion.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

const names = { ids: (i: number) => `ids[${i}]`, logprobs: (i: number) => `logprobs[${i}]` };
const describeT = (t: Trajectory): string => `${TrajectoryStatus[t.status]} ${t.finishReason} ${t.error}`;

describe('a logprob the trajectory cannot carry (finite as a double, not as the proto\u2019s float32)', () => {
  it('is refused where the answer enters, naming the field', () => {
    for (const bad of [-1e39, -3.5e38, -Number.MAX_VALUE]) {
      expect(() => checkSampledTokens([7], [bad], { maxTokens: 4, vocabSize: 100 }, names)).toThrow(CompletionRejected);
      expect(() => checkSampledTokens([7], [bad], { maxTokens: 4, vocabSize: 100 }, names)).toThrow(/logprobs\[0\] = .* float32/);
    }
    // The float32 range itself is kept exactly as sent (never clamped or rounded here).
    const lowest = -3.4028234663852886e38;
    expect(checkSampledTokens([7, 8], [lowest, -1e-45], { maxTokens: 4, vocabSize: 100 }, names).logprobs).toEqual([lowest, -1e-45]);
  });

  describe('through the server', () => {
    let h: ServerHarness;
    beforeAll(async () => {
      h = await startServerHarness();
    });
    afterAll(async () => h?.close());

    it('ends the trajectory BACKEND_ERROR naming the logprob, not ENVIRONMENT_ERROR with its tokens dropped', async () => {
      h.engine.failNext(1, { kind: 'tamper', tamper: (choice) => ((choice.logprobs as { token_logprobs: number[] }).token_logprobs[1] = -1e39) });
      const session = h.client.openSession();
      await session.submit(mathTask('float32-logprob', 1, 4401));
      session.close();
      const [t] = await collect(session.trajectories());
      expect(TrajectoryStatus[t!.status], describeT(t!)).toBe('TRAJECTORY_STATUS_BACKEND_ERROR');
      expect(t!.error).toMatch(/token_logprobs\[1\] = -1e\+39/);
      expect(invariantViolations(t!)).toEqual([]);
    });
  });
});
