import { describe, expect, it } from 'vitest';
import { extractLastBoxed, findFinalAnswer, unwrapBoxed } from '../../../src/environments/math/extract.js';

describe('extractLastBoxed', () => {
  it.each([
    ['The answer is \\boxed{5}.', '5'],
    ['so \\boxed{\\frac{1}{2}}', '\\frac{1}{2}'],
    ['\\boxed{\\frac{\\sqrt{3}}{2}} done', '\\frac{\\sqrt{3}}{2}'],
    ['first \\boxed{1}, then \\boxed{2}', '2'],
    ['the set \\boxed{\\{1, 2\\}}', '\\{1, 2\\}'],
    ['escaped close brace does not end it: \\boxed{a\\}b}', 'a\\}b'],
    ['\\boxed {  7 }', '7'],
    ['\\fbox{3}', '3'],
    ['$\\boxed 42$', '42'],
    ['good \\boxed{3} then broken \\boxed{4', '3'],
    ['{ unrelated } \\boxed{x^{2}} { more }', 'x^{2}'],
    ['nested \\boxed{\\boxed{9}}', '9'],
  ])('%s → %s', (text, expected) => {
    expect(extractLastBoxed(text)).toBe(expected);
  });

  it.each([['no box here'], ['\\boxed{never closed'], ['\\boxedx{1}'], ['']])('%s → undefined', (text) => {
    expect(extractLastBoxed(text)).toBeUndefined();
  });

  it('is linear on many unclosed boxes', () => {
    const text = '\\boxed{'.repeat(50_000);
    const start = performance.now();
    expect(extractLastBoxed(text)).toBeUndefined();
    expect(performance.now() - start).toBeLessThan(500);
  });
});

describe('unwrapBoxed', () => {
  it('unwraps only a whole-string box', () => {
    expect(unwrapBoxed(' \\boxed{\\frac{1}{2}} ')).toBe('\\frac{1}{2}');
    expect(unwrapBoxed('\\boxed{1} + \\boxed{2}')).toBe('\\boxed{1} + \\boxed{2}');
    expect(unwrapBoxed('3')).toBe('3');
  });
});

describe('findFinalAnswer', () => {
  const messages = [
    { role: 'user' as const, content: 'What is 1+1?' },
    { role: 'assistant' as const, content: 'Maybe \\boxed{3}' },
    { role: 'tool' as const, content: '2' },
    { role: 'assistant' as const, content: 'It is \\boxed{2}.' },
  ];

  it('prefers the finish tool answer', () => {
    expect(findFinalAnswer({ messages, finishAnswer: ' 4 ' })).toEqual({ answer: '4', source: 'finish_tool' });
  });

  it('falls back to the last box of the last assistant message', () => {
    expect(findFinalAnswer({ messages })).toEqual({ answer: '2', source: 'boxed' });
    expect(findFinalAnswer({ messages, finishAnswer: '  ' })).toEqual({ answer: '2', source: 'boxed' });
  });

  it('does not look at earlier assistant messages', () => {
    expect(findFinalAnswer({ messages: [...messages, { role: 'assistant', content: 'no idea' }] })).toBeUndefined();
  });
});
