import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { InjectedFailure } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { within } from '../support/wait.js';

/**
 * An engine answering 200 with a sampled-token count that cannot be right, through the whole server: every such answer
 * fails its sample as BACKEND_ERROR with the reason (infrastructure), never a COMPLETED reward-0 trajectory, a
 * TRUNCATED one over a budget that was not reached, or one missing tokens the policy sampled.
 */

const name = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex} ${TrajectoryStatus[t.status]} finish=${t.finishReason} tokens=${t.responseTokenIds.length} ${t.error}`;

let h: ServerHarness;
let fault: ((body: Record<string, unknown>) => InjectedFailure) | undefined;
beforeAll(async () => {
  // The engine states its max_model_len (40960): the server knows how much context every trajectory has left.
  h = await startServerHarness({ config: { backendRequestTimeoutMs: 10_000 }, engine: { maxModelLen: 40960, inject: ({ body }) => fault?.(body) } });
});
afterAll(async () => h?.close());
afterEach(() => {
  fault = undefined;
});

async function run(taskId: string, seed: number): Promise<Trajectory[]> {
  const session = h.client.openSession();
  await session.submit(mathTask(taskId, 2, seed));
  session.close();
  return within(collect(session.trajectories()), 60_000, taskId);
}

function expectBackendError(out: Trajectory[], reason: RegExp): void {
  expect(out).toHaveLength(2);
  for (const t of out) {
    expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_BACKEND_ERROR');
    expect(t.error, name(t)).toMatch(reason);
    expect(invariantViolations(t)).toEqual([]);
  }
}

/** A vLLM /v1/completions answer, consistent in itself (usage counts its ids), of `ids` with `finish`. */
function completion(body: Record<string, unknown>, ids: readonly number[], finish: string): InjectedFailure {
  const tokens = ids.map((id) => `token_id:${id}`);
  const prompt = (body.prompt as unknown[]).length;
  return {
    kind: 'garbage',
    body: JSON.stringify({
      id: 'cmpl-x',
      object: 'text_completion',
      model: h.engine.model,
      choices: [{ index: 0, text: '', finish_reason: finish, stop_reason: null,
        logprobs: { text_offset: tokens.map(() => 0), token_logprobs: ids.map(() => -0.5), tokens, top_logprobs: tokens.map((t) => ({ [t]: -0.5 })) } }],
      usage: { prompt_tokens: prompt, completion_tokens: ids.length, total_tokens: prompt + ids.length },
    }),
  };
}

describe('an engine answer whose token count contradicts its finish_reason or its own usage', () => {
  // Regression: no token with finish "stop" was COMPLETED with reward 0, with "length" TRUNCATED max_model_len.
  it('no token with finish "stop" or "length": BACKEND_ERROR', async () => {
    for (const finish of ['stop', 'length']) {
      fault = (body) => completion(body, [], finish);
      expectBackendError(await run(`empty-${finish}`, finish.length), new RegExp(`no sampled token with finish_reason "${finish}"`));
    }
  });

  // Regression: lists that lost their first entries were taken whole: the trajectory silently lacked sampled tokens.
  it('lists missing the first sampled tokens that usage.completion_tokens still counts: BACKEND_ERROR', async () => {
    fault = () => ({
      kind: 'tamper',
      tamper: (choice) => {
        const lp = choice.logprobs as Record<string, unknown[]>;
        for (const key of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) lp[key] = lp[key]!.slice(3);
      },
    });
    expectBackendError(await run('dropped-3', 9104), /usage\.completion_tokens = \d+, but the answer holds \d+ sampled token ids/);
  });

  // Regression: "length" after 3 of 256 tokens, ~40,000 short of the known limit, was TRUNCATED max_model_len.
  // (The server asks the engine its limit again, in case it restarted with a smaller one; it still says 40960.)
  it('finish "length" after 3 of 256 tokens with ~40,000 tokens of known context left: BACKEND_ERROR, not TRUNCATED max_model_len', async () => {
    const { tokenizer } = await loadQwen3();
    const ids = tokenizer.encode(' Let me think').slice(0, 3);
    fault = (body) => completion(body, ids, 'length');
    expectBackendError(await run('short-length', 9103), /finish_reason "length" after 3 of 256 max_tokens with a \d+-token prompt: \d+ tokens, far from its max_model_len 40960/);
  });

  it('and the server goes on serving honest answers', async () => {
    const out = await run('after-bad-counts', 9105);
    for (const t of out) expect([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED], name(t)).toContain(t.status);
  });
});
