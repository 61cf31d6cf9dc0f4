import { describe, expect, it } from 'vitest';
import { checkEquivalence } from '../../src/environments/math/equivalence.js';

/**
 * Two leniencies of the built-in math checker that math-verify (python/math-verify, the pinned version) does not have,
 * checked against it: a decimal within 6-place rounding of an integer was equal to it ("5.0000001" = "5"; math-verify's
 * sympy compares the rounded Float with the Integer exactly), and "or"/"and" with what follows were read as a unit
 * ("5 or x" = "5"; math-verify reads the set {5, x}). The agreement corpus keeps its 323/330 with both rules tightened.
 */
describe('built-in math checker, as math-verify: decimals against integers, alternatives', () => {
  it.each([
    ['5.0000001', '5'],
    ['5.0000004', '5'],
    ['-3.0000001', '-3'],
    ['0.0000004', '0'],
    ['2.0000001', '\\sqrt{4}'],
    ['5.0000001', '\\frac{10}{2}'],
    ['5 or x', '5'],
    ['5 or more', '5'],
    ['5 and up', '5'],
  ])('%s is not %s (math-verify: not equivalent)', (predicted, reference) => {
    expect(checkEquivalence(predicted, reference).equivalent).toBe(false);
    expect(checkEquivalence(reference, predicted).equivalent).toBe(false);
  });

  it.each([
    ['5.0', '5'],
    ['5.000000', '5'],
    ['0.0', '0'],
    ['5.0000001', '5.0'],
    ['0.5000001', '\\frac12'],
    ['1.4142136', '\\sqrt{2}'],
    ['0.3333333', '\\frac13'],
    ['1234567.1000004', '1234567.1'],
    ['5 cm', '5'],
  ])('%s is still %s (math-verify: equivalent)', (predicted, reference) => {
    expect(checkEquivalence(predicted, reference).equivalent).toBe(true);
    expect(checkEquivalence(reference, predicted).equivalent).toBe(true);
  });
});
