import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Role } from '../../gen/ts/rollout/v1/rollout.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';
import { collect, invariantViolations, mathTask, startHarness, type Harness } from '../support/harness.js';

interface Completion {
  promptIds: readonly number[];
  tokenIds: readonly number[];
  logprobs: readonly number[];
}

/** Token ids no tokenizer would produce for the text: every character encoded on its own. */
function characterwise(tokenizer: Tokenizer): (text: string) => number[] {
  return (text) => [...text].flatMap((ch) => tokenizer.encode(ch));
}

describe('token-in / token-out through the whole server', () => {
  let h: Harness;
  const completions: Completion[] = [];
  let tokenizer: Tokenizer;
  beforeAll(async () => {
    tokenizer = (await loadQwen3()).tokenizer;
    h = await startHarness({}, { tokenize: characterwise(tokenizer), onCompletion: (c) => completions.push(c) });
  });
  afterAll(async () => h?.close());

  it('sends the ledger ids as the prompt and records the engine ids and logprobs verbatim, even non-canonical ones', async () => {
    const session = h.client.openSession();
    await session.submit(mathTask('fidelity', 3, 77));
    session.close();
    const trajectories = await collect(session.trajectories());
    expect(trajectories).toHaveLength(3);
    // Samples of a group share their first prompt (and differ by seed), so a prompt may have several answers.
    const byPrompt = new Map<string, Completion[]>();
    for (const c of completions) byPrompt.set(c.promptIds.join(','), [...(byPrompt.get(c.promptIds.join(',')) ?? []), c]);
    let assistantTurns = 0;
    for (const t of trajectories) {
      expect(invariantViolations(t)).toEqual([]);
      const all = [...t.promptTokenIds, ...t.responseTokenIds];
      for (const turn of t.turns.filter((x) => x.role === Role.ROLE_ASSISTANT)) {
        assistantTurns++;
        // The engine was asked with exactly the ids before this turn...
        const answers = byPrompt.get(all.slice(0, t.promptTokenIds.length + turn.start).join(',')) ?? [];
        expect(answers.length, `turn at ${turn.start} of ${t.taskId}#${t.sampleIndex}`).toBeGreaterThan(0);
        // ...and one of its answers is in the response unchanged: ids exactly, logprobs at float32 precision
        // (proto float).
        const ids = t.responseTokenIds.slice(turn.start, turn.end);
        const logprobs = t.responseLogprobs.slice(turn.start, turn.end);
        const match = answers.filter(
          (c) => c.tokenIds.length === ids.length && c.tokenIds.every((x, i) => x === ids[i]) && c.logprobs.every((x, i) => Math.fround(x) === logprobs[i]),
        );
        expect(match.length, `verbatim ids and logprobs for turn at ${turn.start}`).toBeGreaterThan(0);
      }
      // Non-canonical on purpose: re-tokenizing the decoded text would give other (fewer) ids.
      const firstTurn = t.turns[0]!;
      const sampled = t.responseTokenIds.slice(firstTurn.start, firstTurn.end);
      expect(tokenizer.encode(tokenizer.decode(sampled)).length).toBeLessThan(sampled.length);
    }
    expect(assistantTurns).toBeGreaterThanOrEqual(6);
  });
});
