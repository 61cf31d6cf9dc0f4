import { describe, expect, it } from 'vitest';
import { resolveChoice } from '../../../src/environments/stem/choice.js';
import { createStemEnvironment } from '../../../src/environments/stem/stem-environment.js';
import type { EpisodeOutcome } from '../../../src/environments/types.js';
import { FakeSandbox } from '../fake-sandbox.js';

const stem = createStemEnvironment();
const question = { question: 'Which is a noble gas?', choices: ['Nitrogen', 'Argon', 'Oxygen', 'Hydrogen'], answer: 'B' };
const ten = ['1', '2', '3', '4', '5', '6', '7', '8', '9', '10'];

async function score(outcome: Partial<EpisodeOutcome>) {
  return stem.evaluate({ instance: stem.validate(question), outcome: { messages: [], finishReason: 'answer', ...outcome }, sandbox: new FakeSandbox(), signal: new AbortController().signal });
}

describe('multiple choice: a letter in TeX text wrappers', () => {
  it.each([['\\text{B}'], ['\\textbf{B}'], ['\\mathrm{B}'], ['\\mathbf{(B)}'], ['\\text{(B) Argon}'], ['\\boxed{B}'], ['\\boxed{\\text{B}}'], ['$\\text{B}$']])('%s names B', (answer) => {
    expect(resolveChoice(answer, question.choices)).toBe(1);
  });

  it('rewards \\boxed{\\text{B}}, the way models trained on math answer, and the finish tool given the same', async () => {
    expect(await score({ messages: [{ role: 'assistant', content: 'Argon is inert. \\boxed{\\text{B}}' }] })).toMatchObject({ reward: 1, report: { chosen: 'B', source: 'boxed' } });
    expect(await score({ finishAnswer: '\\textbf{B}' })).toMatchObject({ reward: 1, report: { chosen: 'B' } });
    expect(await score({ finishAnswer: '\\text{C}' })).toMatchObject({ reward: 0, report: { chosen: 'C' } });
  });
});

describe('multiple choice: a list of candidate letters names no choice', () => {
  it.each([['A or B'], ['B or C'], ['A, B'], ['B, A'], ['A and B'], ['(A) or (B)'], ['(B) and (C)'], ['B/C'], ['A B C D'], ['B & D']])('%s names none', (answer) => {
    expect(resolveChoice(answer, question.choices)).toBeUndefined();
  });

  it.each([
    ['B, not A', 1],
    ['B because A is a diatomic gas', 1],
    ['B. Argon', 1],
    ['(B) Argon', 1],
    ['C. A noble gas is not reactive', 2],
  ])('%s still names one choice (%i)', (answer, index) => {
    expect(resolveChoice(answer, question.choices)).toBe(index);
  });

  it('a letter out of range after "or" is no other choice; with ten choices it is', () => {
    expect(resolveChoice('B or J', question.choices)).toBe(1);
    expect(resolveChoice('B or J', ten)).toBeUndefined();
  });

  it('scores a hedged reply 0 with no choice (it was 1 when the first letter was right)', async () => {
    expect(await score({ messages: [{ role: 'assistant', content: 'The answer is B or C.' }] })).toMatchObject({ reward: 0, details: { has_answer: 1 }, report: { chosen: null } });
    expect(await score({ finishAnswer: 'B, C' })).toMatchObject({ reward: 0, report: { chosen: null } });
    expect(await score({ finishAnswer: 'A B C D' })).toMatchObject({ reward: 0, report: { chosen: null } });
  });
});

describe('multiple choice with ten options: the pronoun I is not choice I', () => {
  it.each([['I think B'], ['I would pick C.'], ['I believe it is D']])('%s does not name I', (answer) => {
    expect(resolveChoice(answer, ten)).not.toBe(8);
  });

  it.each([['I'], ['(I)'], ['I. 9'], ['I) 9'], ['I because 9 is odd']])('%s still names I', (answer) => {
    expect(resolveChoice(answer, ten)).toBe(8);
  });
});
