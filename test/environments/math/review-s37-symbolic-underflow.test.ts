import { describe, expect, it } from 'vitest';
import { checkEquivalence } from '../../../src/environments/math/equivalence.js';

/**
 * Expressions with variables are compared by their values at eight points. A value that underflows (x^{3000} at
 * 3/7) or is merely tiny (e^{-1000x^2}) is ~0 in floats, and the absolute floor of the float comparison calls two
 * such values equal: before the fix "x^{3000}" was reward 1 against every reference answer of 0, and x^{2001}
 * equalled x^{2000} (the points above 1 overflow and are skipped; the others are all ~0).
 */
describe('symbolic comparison: points where both values are negligible floats prove nothing', () => {
  it.each([
    ['x^{3000}', '0'],
    ['y^{5000}', '0'],
    ['10^{-400}x', '0'],
    ['e^{-1000x^2}', '0'],
    ['x^{2001}', 'x^{2000}'],
    ['x^{3000}', 'x^{4000}'],
  ])('%s is not %s', (predicted, reference) => {
    expect(checkEquivalence(predicted, reference).equivalent).toBe(false);
    expect(checkEquivalence(reference, predicted).equivalent).toBe(false);
  });

  it.each([
    ['(x+1)^2', 'x^2+2x+1'],
    ['\\sin^2 x + \\cos^2 x', '1'],
    ['x - x', '0'],
    ['\\frac{x^2-1}{x-1}', 'x+1'],
    ['e^{-x}', '\\frac{1}{e^x}'],
  ])('%s still equals %s', (predicted, reference) => {
    expect(checkEquivalence(predicted, reference)).toEqual({ equivalent: true, method: 'symbolic' });
  });
});

/**
 * "a = b = c" is a chain whose last side is the answer, but "x = 2, x = 3" and "x = 2 or x = 3" are two answers:
 * before the fix they were read as the chain x = 3, so listing candidates as relations scored against a reference
 * of 3 (math-verify reads them as the set {x = 2, x = 3}, which is not 3).
 */
describe('relations: a list of candidate relations is not a chain', () => {
  it.each([
    ['x=2, x=3', '3'],
    ['x=2, x=3', 'x=3'],
    ['x = 2 or x = 3', '3'],
    ['x=2 \\text{ or } x=3', '3'],
    ['x=2 \\lor x=3', '3'],
    ['x=2; x=3', '3'],
    ['x = 2 and y = 3', 'y = 3'],
  ])('%s is not %s', (predicted, reference) => {
    expect(checkEquivalence(predicted, reference).equivalent).toBe(false);
    expect(checkEquivalence(reference, predicted).equivalent).toBe(false);
  });

  it.each([
    ['a = b = 3', '3'],
    ['\\frac12+\\frac13=\\frac56', '\\frac56'],
    ['x = 1, 2', '1, 2'],
    ['x=2, x=3', '2, 3'],
    ['x=2, x=3', 'x=3, x=2'],
    ['f(1, 2) = 3', '3'],
  ])('%s still equals %s', (predicted, reference) => {
    expect(checkEquivalence(predicted, reference).equivalent).toBe(true);
  });
});
