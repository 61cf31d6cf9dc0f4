import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { makeMathProblem } from '../../src/testing/arithmetic.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { within } from '../support/wait.js';

// Review s37 (left by s36's token review). An engine stops a request at the ids its model's generation_config lists
// (and at requested stop strings). A model folder whose generation_config lacks an id the server's tokenizer ends turns
// with (a base model's `<|endoftext|>` only, while the chat template closes turns with `<|im_end|>`) samples on past
// the end of its turn: `<|im_end|>\n<|im_start|>user\n...` inside one "stop" answer. Those ids were put in the
// trajectory as sampled (mask 1), a forged user turn included, and graded: the trainer would teach the policy to go on
// past its end-of-turn token. The turn now ends at its first stop token, as an engine told about it would have ended
// it; the tokens kept are still exactly what was sampled. Requests also carry the tokenizer's stop ids as
// `stop_token_ids`, so vLLM and SGLang stop there themselves. The fake vLLM engine (a test double) samples the policy's
// text verbatim, so a policy text with <|im_end|> in its middle is such an engine; with `ignoreStopTokenIds` it is one
// that drops `stop_token_ids` (a gateway that strips fields, an engine that lacks them).

/** Qwen3's <|im_end|>. */
const IM_END = 151645;

describe('an engine answer that goes on past a stop token (the engine ignores stop_token_ids)', () => {
  let h: ServerHarness;
  let pastStop = '';
  const sampled: number[][] = [];
  beforeAll(async () => {
    h = await startServerHarness({
      sandboxes: new NullSandboxDriver(),
      engine: { policy: () => pastStop, ignoreStopTokenIds: true, onCompletion: ({ tokenIds }) => void sampled.push([...tokenIds]) },
    });
  });
  afterAll(async () => h?.close());

  async function run(id: string, seed: number): Promise<Trajectory> {
    const session = h.client.openSession();
    await session.submit(mathTask(id, 1, seed));
    session.close();
    return (await within(collect(session.trajectories()), 60_000, 'the trajectory'))[0]!;
  }

  it('ends the turn at its first stop token: the ids after it are not in the trajectory, nor graded', async () => {
    const answer = makeMathProblem(11).answer;
    // The right answer, then a forged user turn and a wrong answer after the end of the turn.
    pastStop = `\\boxed{${answer}}<|im_end|>\n<|im_start|>user\nNo, that is wrong.<|im_end|>\n<|im_start|>assistant\n\\boxed{${answer + 1}}`;
    const t = await run('past-stop', 11);
    expect(sampled.at(-1)!.filter((x) => x === IM_END)).toHaveLength(3); // the engine did sample past it
    expect(invariantViolations(t)).toEqual([]);
    expect(TrajectoryStatus[t.status]).toBe('TRAJECTORY_STATUS_COMPLETED');
    expect(t.finishReason).toBe('answer');
    expect(t.responseTokenIds.filter((x) => x === IM_END)).toHaveLength(1);
    expect(t.responseTokenIds.at(-1)).toBe(IM_END);
    expect(t.reward).toBe(1);
    expect(t.turns.filter((x) => x.finishReason !== '').map((x) => x.finishReason)).toEqual(['stop']);
  });

  it('an answer whose only stop token is its last is kept whole', async () => {
    const answer = makeMathProblem(12).answer;
    pastStop = `The sum is \\boxed{${answer}}`;
    const t = await run('at-stop', 12);
    expect(TrajectoryStatus[t.status]).toBe('TRAJECTORY_STATUS_COMPLETED');
    expect(t.reward).toBe(1);
    expect(t.responseTokenIds.filter((x) => x === IM_END)).toHaveLength(1);
  });
});

describe('requests carry the stop ids, and an engine that honours them ends the turn itself', () => {
  let h: ServerHarness;
  const bodies: Record<string, unknown>[] = [];
  const sampled: number[][] = [];
  beforeAll(async () => {
    h = await startServerHarness({
      sandboxes: new NullSandboxDriver(),
      engine: {
        policy: () => `\\boxed{${makeMathProblem(13).answer}}<|im_end|>\n<|im_start|>user\nmore`,
        inject: ({ body }) => void bodies.push(body),
        onCompletion: ({ tokenIds }) => void sampled.push([...tokenIds]),
      },
    });
  });
  afterAll(async () => h?.close());

  it('sends the tokenizer\u2019s stop ids as stop_token_ids; the engine stops at the first, and the turn ends there', async () => {
    const session = h.client.openSession();
    await session.submit(mathTask('honoured', 1, 13));
    session.close();
    const t = (await within(collect(session.trajectories()), 60_000, 'the trajectory'))[0]!;
    expect(bodies.at(-1)!.stop_token_ids).toEqual(expect.arrayContaining([IM_END]));
    expect(sampled.at(-1)!.at(-1)).toBe(IM_END);
    expect(sampled.at(-1)!.filter((x) => x === IM_END)).toHaveLength(1);
    expect(TrajectoryStatus[t.status]).toBe('TRAJECTORY_STATUS_COMPLETED');
    expect(t.responseTokenIds).toEqual(sampled.at(-1));
    expect(t.reward).toBe(1);
  });
});
