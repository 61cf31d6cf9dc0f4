import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { choiceLetter, findStemAnswer, resolveChoice } from '../../../src/environments/stem/choice.js';
import { createStemEnvironment } from '../../../src/environments/stem/stem-environment.js';
import type { EpisodeOutcome } from '../../../src/environments/types.js';
import { FakeSandbox } from '../fake-sandbox.js';

const stem = createStemEnvironment();
const choices = ['42 J', '0.5', 'Argon', 'None of these'];
const reply = (content: string, finishAnswer?: string): EpisodeOutcome => ({ messages: [{ role: 'assistant', content }], finishReason: 'answer', ...(finishAnswer !== undefined && { finishAnswer }) });

async function score(instance: unknown, outcome: EpisodeOutcome) {
  const validated = stem.validate(instance);
  return stem.evaluate({ instance: validated, outcome, sandbox: new FakeSandbox(), signal: new AbortController().signal });
}

describe('multiple-choice answers', () => {
  it.each([
    ['B', 1], ['(B)', 1], ['**B**', 1], ['b', 1], ['B) 0.5', 1], ['B. 0.5', 1], ['The answer is (B)', 1], ['Option B', 1],
    ['C because it is a noble gas', 2], ['argon.', 2], ['1/2', 1], ['$\\frac{1}{2}$', 1], ['None of these', 3],
  ])('%s names choice %i', (answer, index) => {
    expect(resolveChoice(answer, choices)).toBe(index);
  });

  it.each([['E'], ['a cat'], ['B) 42 J'], ['Helium'], ['']])('%s names none (out of range, an article, self-contradictory, unknown)', (answer) => {
    expect(resolveChoice(answer, choices)).toBeUndefined();
  });

  it('finds the answer in a reply: finish tool, then \\boxed{}, then the last "answer is", then a short reply', () => {
    expect(findStemAnswer(reply('The answer is (A).', 'C'))).toEqual({ answer: 'C', source: 'finish_tool' });
    expect(findStemAnswer(reply('Maybe A. So \\boxed{B}.'))).toEqual({ answer: 'B', source: 'boxed' });
    expect(findStemAnswer(reply('I first thought the answer is A. Checking again, the answer is (C). It is inert.'))).toEqual({ answer: '(C)', source: 'answer_phrase' });
    expect(findStemAnswer(reply('**D**'))).toEqual({ answer: '**D**', source: 'short_reply' });
    expect(findStemAnswer(reply('A long explanation without any conclusion. '.repeat(5)))).toBeUndefined();
  });

  it('resolves every usual dressing of the correct letter or its text (property)', () => {
    const text = fc.stringMatching(/^[a-z][a-z ]{2,15}[a-z]$/);
    fc.assert(
      fc.property(fc.uniqueArray(text, { minLength: 2, maxLength: 8, selector: (s) => s.replace(/ +/g, ' ') }), fc.nat(), (options, k) => {
        const i = k % options.length;
        const letter = choiceLetter(i);
        for (const answer of [letter, `(${letter})`, `**${letter}**`, `${letter}) ${options[i]}`, `The answer is (${letter}).`, options[i]!, options[i]!.toUpperCase()]) {
          expect(resolveChoice(answer, options), answer).toBe(i);
        }
      }),
    );
  });
});

describe('the stem environment', () => {
  it('reports a long answer cut to 500 characters with its length (extracted_chars), never cut silently or inside a surrogate pair', async () => {
    const q = { question: 'Which is a noble gas?', choices, answer: 'Argon' };
    const long = `${'x'.repeat(499)}\u{1F600}${'y'.repeat(1000)}`; // the emoji's pair straddles the cut
    const r = await score(q, reply('', long));
    expect(r.report).toMatchObject({ extracted_chars: long.length, source: 'finish_tool' });
    const extracted = (r.report as { extracted: string }).extracted;
    expect(extracted).toBe(`${'x'.repeat(499)}…`);
    expect(await score(q, reply('', 'Argon'))).toMatchObject({ report: { extracted: 'Argon' } });
    expect((await score(q, reply('', 'Argon'))).report).not.toHaveProperty('extracted_chars');
  });

  it('scores multiple choice by letter or text, and no answer as 0 with has_answer 0', async () => {
    const q = { question: 'Which is a noble gas?', choices, answer: 'Argon' };
    expect(stem.validate(q)).toMatchObject({ kind: 'choice', correct: 2 });
    expect(await score(q, reply('The answer is (C).'))).toMatchObject({ reward: 1, details: { correct: 1, has_answer: 1 }, report: { chosen: 'C', correct_choice: 'C', source: 'answer_phrase' } });
    expect(await score(q, reply('', 'argon'))).toMatchObject({ reward: 1 });
    expect(await score(q, reply('The answer is (B).'))).toMatchObject({ reward: 0, report: { chosen: 'B' } });
    expect(await score(q, reply('I am not sure about this one: there are many gases, and several of them could fit the description given here.'))).toMatchObject({ reward: 0, details: { has_answer: 0 } });
  });

  it('scores numeric answers with units and the instance tolerance', async () => {
    const q = { question: 'How far?', answer: 5, unit: 'km', tolerance: 0.02 };
    expect(await score(q, reply('\\boxed{5.05\\ \\mathrm{km}}'))).toMatchObject({ reward: 1, report: { reason: 'within_tolerance', converted: 5.05, unit: 'km', tolerance: 0.02 } });
    expect(await score(q, reply('', '4980 m'))).toMatchObject({ reward: 1, report: { converted: 4.98 } });
    expect(await score(q, reply('', '5 hours'))).toMatchObject({ reward: 0, report: { reason: 'unit_mismatch' } });
    expect(await score(q, reply('', '5.2 km'))).toMatchObject({ reward: 0, report: { reason: 'outside_tolerance' } });
    expect(await score({ question: 'c?', answer: '3.00e8 m/s' }, reply('The answer is 2.998 × 10^8 m/s.'))).toMatchObject({ reward: 1 });
    expect(await score({ question: 'Share?', answer: '45%' }, reply('', '0.45'))).toMatchObject({ reward: 1 });
  });

  it('asks for the unit in the prompt and lists choices as A) ...', () => {
    expect(stem.prompt!(stem.validate({ question: 'How far?', answer: 5, unit: 'km' }))[1]!.content).toBe('How far?\n\nGive the answer in km.');
    expect(stem.prompt!(stem.validate({ question: 'Gas?', choices: ['N2', 'Ar'], answer: 'B' }))[1]!.content).toBe('Gas?\n\nA) N2\nB) Ar');
  });

  it('rejects bad instances by field', () => {
    const bad = (instance: unknown) => {
      try {
        stem.validate(instance);
      } catch (err) {
        return (err as { field?: string; message: string }).message;
      }
      return 'accepted';
    };
    expect(bad({ question: 'q', choices: ['a', 'b'], answer: 'C' })).toBe('instance.answer: must be a choice letter (A–B) or the text of one choice');
    expect(bad({ question: 'q', answer: 'many' })).toBe('instance.answer: must be a number (optionally with a unit) when there are no choices');
    expect(bad({ question: 'q', answer: '5 km', unit: 's' })).toBe('instance.unit: is not compatible with the answer\'s unit "km"');
    expect(bad({ question: 'q', choices: ['only one'], answer: 'A' })).toBe('instance.choices: must hold at least 2 choices');
    expect(bad({ question: 'q', answer: 1, tolerance: -1 })).toMatch(/^instance\.tolerance: /);
    expect(bad({ answer: 1 })).toBe('instance.question: required');
  });
});
