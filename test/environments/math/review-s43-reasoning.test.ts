import { describe, expect, it } from 'vitest';
import { findFinalAnswer, finalReply } from '../../../src/environments/math/extract.js';
import { createMathEnvironment } from '../../../src/environments/math/math-environment.js';
import { findStemAnswer } from '../../../src/environments/stem/choice.js';
import { createStemEnvironment } from '../../../src/environments/stem/stem-environment.js';
import type { EpisodeOutcome } from '../../../src/environments/types.js';
import { FakeSandbox } from '../fake-sandbox.js';

/** An episode whose last assistant message is `content` (as decoded from the sampled ids, reasoning included). */
const said = (content: string): Pick<EpisodeOutcome, 'messages'> => ({ messages: [{ role: 'user', content: 'q' }, { role: 'assistant', content }] });

describe('the answer is read from the reply after the reasoning, never from a draft inside <think>', () => {
  it('finalReply: the text after the reasoning block, nothing when the message was cut inside it', () => {
    expect(finalReply('<think>maybe \\boxed{3}</think>\n\nSo \\boxed{4}.')).toBe('\n\nSo \\boxed{4}.');
    expect(finalReply('\n<think>drafting \\boxed{3}')).toBe('');
    expect(finalReply('opened by the template \\boxed{3}</think> reply')).toBe(' reply');
    expect(finalReply('no reasoning \\boxed{3}')).toBe('no reasoning \\boxed{3}');
  });

  it('math: a box drafted in the reasoning is no answer (has_answer 0), whether the reply has none or the message was cut', async () => {
    expect(findFinalAnswer(said('<think>Is it \\boxed{42}? Let me check.</think>\nThe answer is 42.'))).toBeUndefined();
    expect(findFinalAnswer(said('<think>Is it \\boxed{42}? Let me check further, the number of'))).toBeUndefined();
    expect(findFinalAnswer(said('<think>first \\boxed{41}</think> then \\boxed{42}'))).toEqual({ answer: '42', source: 'boxed' });
    const math = createMathEnvironment();
    const instance = math.validate({ problem: 'Six times seven?', answer: '42' });
    const evaluate = (outcome: Pick<EpisodeOutcome, 'messages'>) =>
      math.evaluate({ instance, outcome: { ...outcome, finishReason: 'max_total_tokens' }, sandbox: new FakeSandbox(), signal: new AbortController().signal });
    expect(await evaluate(said('<think>Six sevens: \\boxed{42}, I think; but let me verify by adding 7 six'))).toMatchObject({ reward: 0, details: { has_answer: 0 } });
    expect(await evaluate(said('<think>Six sevens: \\boxed{42}?</think>\n\\boxed{42}'))).toMatchObject({ reward: 1, details: { has_answer: 1 } });
  });

  it('stem: "the answer is" in the reasoning is not the answer; the short reply after it is', async () => {
    expect(findStemAnswer(said('<think>So the answer is A? No wait, argon is inert.</think>\n\nB'))).toEqual({ answer: 'B', source: 'short_reply' });
    expect(findStemAnswer(said('<think>the answer is A</think> I pick B.'))).toEqual({ answer: 'I pick B.', source: 'short_reply' });
    expect(findStemAnswer(said('<think>the answer is A, surely. Let me double-check the'))).toBeUndefined();
    const stem = createStemEnvironment();
    const instance = stem.validate({ question: 'Which is a noble gas?', choices: ['Nitrogen', 'Argon'], answer: 'B' });
    const evaluate = (outcome: Pick<EpisodeOutcome, 'messages'>) =>
      stem.evaluate({ instance, outcome: { ...outcome, finishReason: 'answer' }, sandbox: new FakeSandbox(), signal: new AbortController().signal });
    expect(await evaluate(said('<think>Nitrogen is diatomic... the answer is B, argon. Let me think about helium, which is'))).toMatchObject({ reward: 0, details: { has_answer: 0 } });
    expect(await evaluate(said(`<think>${'Considering each option in turn. '.repeat(10)}the answer is A? No: argon.</think>\n\nB`))).toMatchObject({ reward: 1, report: { chosen: 'B' } });
  });
});
