import { describe, expect, it } from 'vitest';
import { measureAgreement, type AnswerPair } from '../../../bench/math/agreement.js';
import { checkEquivalence } from '../../../src/environments/math/equivalence.js';
import { findMathVerify } from '../../../src/environments/math/math-verify-checker.js';

/**
 * Answer forms the built-in checker judged otherwise than math-verify (session 43 review), each with math-verify's own
 * verdict, which the built-in one now gives: [pred, gold, equivalent, why].
 */
const PAIRS: ReadonlyArray<readonly [string, string, boolean, string]> = [
  // "or" / "and" join answers into a list (math-verify reads a set): a list of solutions written so was 0.
  ['x = 3 \\text{ or } x = -4', '-4, 3', true, 'solutions joined by \\text{ or }'],
  ['x = 3 \\text{ and } x = -4', '\\{3, -4\\}', true, 'solutions joined by \\text{ and }'],
  ['3 or 4', '3, 4', true, 'a plain "or"'],
  ['3 \\text{ or } 4', '3, 4', true, 'numbers joined by \\text{ or }'],
  ['2 and 3', '\\{2, 3\\}', true, 'a plain "and" against a set'],
  // ...and stay two answers, never one of them.
  ['3 \\text{ or } 4', '3', false, 'two candidates are not the answer'],
  ['3 or 4', '4', false, 'two candidates are not the answer (the last)'],
  ['x = 3 \\text{ or } x = 4', '4', false, 'two relations are not the answer'],
  ['5 \\text{ or } x', '5', false, 'alternatives, not a unit'],
  // A letter after a number is a variable, not a unit, when the other side is an expression in it.
  ['\\frac34 x', '\\frac{3x}{4}', true, 'a coefficient before a spaced variable'],
  ['\\frac{3}{4} x', '3x/4', true, 'a coefficient before a spaced variable'],
  ['3 x', 'x \\cdot 3', true, 'a spaced product'],
  ['\\sqrt{2} x', 'x\\sqrt2', true, 'an irrational coefficient'],
  ['\\pi r', 'r\\pi', true, 'pi times a variable'],
  ['\\frac{1}{2} bh', '\\frac{bh}{2}', true, 'a two-letter product after a coefficient (read as a unit word before)'],
  ['3 xy', '3yx', true, 'a two-letter product after a number'],
  ['2\\pi rh', '2h\\pi r', true, 'a two-letter product after an irrational'],
  ['4 xy', '2xy', false, 'another coefficient'],
  ['5 cm', '5x', false, 'a unit is still no variable'],
  ['\\frac34 x', '\\frac34 y', false, 'another variable'],
  ['5 x', '5', false, 'a one-letter word that is no unit is a variable'],
  ['2 y', '2', false, 'a one-letter word that is no unit is a variable'],
  ['5 m', '5', true, 'a one-letter unit is still dropped'],
  // Membership states the set.
  ['x \\in [1,2]', '[1,2]', true, 'membership in an interval'],
  ['x \\in \\{1,2\\}', '1, 2', true, 'membership in a finite set'],
  ['x \\in (1,5)', '3', false, 'an interval holding the answer is not the answer'],
  // Binomial coefficients are evaluated.
  ['\\binom{10}{3}', '120', true, 'a binomial coefficient'],
  ['\\dbinom{5}{2}', '10', true, 'a display-style binomial coefficient'],
  ['\\binom{5}{7}', '0', true, 'k > n'],
  ['\\binom{10}{3}', '119', false, 'another number'],
  // \mathbf is a text wrapper, as \textbf.
  ['\\mathbf{C}', 'C', true, 'a bold choice letter'],
];

describe('binomial coefficients made to be expensive', () => {
  // Computed to the end, \binom{10^{9}}{20000} (a number of 500,000 bits) cost ~0.9 s, and sixteen of them in a list
  // compared element-wise ran past the checker's 5 s CPU bound (reward 0 by checker_limit, a thread replaced).
  it('stop once past the range of doubles, so a huge one costs milliseconds', () => {
    const started = performance.now();
    for (const k of ['20000', '20001', '20002']) expect(checkEquivalence(`\\binom{10^{9}}{${k}}`, '1').equivalent).toBe(false);
    expect(checkEquivalence('\\binom{10^{300}}{10^{5}}', '\\binom{10^{300}}{10^{5}}+1').equivalent).toBe(false);
    expect(performance.now() - started).toBeLessThan(1_000);
  });
});

describe('answer forms math-verify reads and the built-in checker now reads the same way', () => {
  it.each(PAIRS)('%s vs %s → %s (%s)', (pred, gold, expected) => {
    expect(checkEquivalence(pred, gold).equivalent).toBe(expected);
    expect(checkEquivalence(gold, pred).equivalent).toBe(expected);
  });

  // math-verify itself (in a bubblewrap sandbox), so the table above is its verdict and not our guess of it.
  it.runIf(findMathVerify())(
    'math-verify gives every verdict of the table',
    async () => {
      const pairs: AnswerPair[] = PAIRS.map(([pred, gold]) => ({ category: 'review-s43', gold, pred }));
      const report = await measureAgreement(pairs);
      expect(report.total).toBe(PAIRS.length);
      expect(report.disagreements.map((d) => d.pair)).toEqual([]);
    },
    120_000,
  );
});
