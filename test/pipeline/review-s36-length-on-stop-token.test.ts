import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { within } from '../support/wait.js';

// An engine that reaches max_tokens on the very token that ends the turn (<|im_end|>) may say finish "length": vLLM
// v1 checks the length cap before the stop token (check_stop). The turn is complete — its end-of-turn token was
// sampled — and was reported TRUNCATED (max_tokens_per_turn), a policy outcome the model did not produce (found by
// helper-61's review). The fake vLLM engine (a test double) answers such a request "stop"; the tamper makes it answer
// as vLLM v1 does.

/** Qwen3's <|im_end|>. */
const IM_END = 151645;

describe('a turn cut by max_tokens on its own end-of-turn token', () => {
  let h: ServerHarness;
  let tampered = 0;
  beforeAll(async () => {
    h = await startServerHarness({
      sandboxes: new NullSandboxDriver(),
      engine: {
        policy: () => 'done',
        inject: ({ body }) => ({
          kind: 'tamper',
          tamper: (choice) => {
            const lp = choice.logprobs as { tokens: string[] };
            const ids = (choice.token_ids as number[] | null) ?? lp.tokens.map((t) => Number(t.replace(/^token_id:/, '')));
            if (ids.length === body.max_tokens && ids.at(-1) === IM_END) {
              choice.finish_reason = 'length';
              tampered++;
            }
          },
        }),
      },
    });
  });
  afterAll(async () => h?.close());

  async function run(maxTokensPerTurn: number): Promise<Trajectory> {
    const task = mathTask(`cut-${maxTokensPerTurn}`, 1, 5);
    task.sampling = { ...task.sampling!, maxTokensPerTurn };
    const session = h.client.openSession();
    await session.submit(task);
    session.close();
    const got = await within(collect(session.trajectories()), 60_000, 'the trajectory');
    return got[0]!;
  }

  it('ends as the answer it is, its span finish "stop"', async () => {
    // 'done' and <|im_end|>: two tokens, exactly the turn's budget.
    const t = await run(2);
    expect(tampered).toBe(1);
    expect(invariantViolations(t)).toEqual([]);
    expect(t.responseTokenIds.at(-1)).toBe(IM_END);
    expect({ status: TrajectoryStatus[t.status], finish: t.finishReason, span: t.turns.filter((x) => x.finishReason !== '').map((x) => x.finishReason) }).toEqual({
      status: 'TRAJECTORY_STATUS_COMPLETED',
      finish: 'answer',
      span: ['stop'],
    });
  });

  it('a turn really cut by max_tokens (its last token not the end of turn) is still TRUNCATED', async () => {
    const t = await run(1);
    expect(TrajectoryStatus[t.status]).toBe('TRAJECTORY_STATUS_TRUNCATED');
    expect(t.finishReason).toBe('max_tokens_per_turn');
    expect(t.responseTokenIds.at(-1)).not.toBe(IM_END);
  });
});
