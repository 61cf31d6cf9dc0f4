import { describe, expect, it } from 'vitest';
import { answersEquivalent, checkEquivalence } from '../../../src/environments/math/equivalence.js';
import { PrecisionLost, rational } from '../../../src/environments/math/rational.js';

/** [predicted, reference, equivalent?, why] */
const TABLE: ReadonlyArray<readonly [string, string | number, boolean, string]> = [
  // integers and separators
  ['1000', '1,000', true, 'thousands separator'],
  ['1,000,000', 1000000, true, 'thousands separators, numeric reference'],
  ['1{,}000', '1000', true, 'LaTeX thousands separator'],
  ['1e3', '1000', true, 'scientific notation'],
  ['1.5E-3', '0.0015', true, 'scientific notation, negative exponent'],
  ['42', 42, true, 'number reference'],
  ['042', '42', true, 'leading zero'],
  ['42', '43', false, 'different integers'],
  ['1, 2', '12', false, 'a list is not a thousands number'],
  // decimals and fractions
  ['0.5', '1/2', true, 'decimal vs slash fraction'],
  ['0.5', '\\frac{1}{2}', true, 'decimal vs \\frac'],
  ['\\dfrac12', '0.5', true, '\\dfrac with single-digit arguments'],
  ['\\tfrac{2}{4}', '\\frac12', true, 'unreduced fraction'],
  ['1/3', '\\frac{1}{3}', true, 'slash vs \\frac'],
  ['0.333', '1/3', false, 'a rounded decimal is not the fraction'],
  ['0.3333333', '\\frac13', true, 'a decimal is compared rounded to 6 places, as math-verify does'],
  ['0.33333', '\\frac13', false, 'five places are not six'],
  ['-\\frac12', '-0.5', true, 'negative fraction'],
  ['\\frac{-1}{2}', '-1/2', true, 'sign inside the numerator'],
  ['-0.5', '0.5', false, 'sign matters'],
  ['2\\frac{1}{2}', '2.5', true, 'mixed number'],
  ['3\\frac{\\sqrt{2}}{2}', '\\frac{3\\sqrt2}{2}', true, 'a \\frac after a number that is not a proper fraction is a product'],
  ['.5', '0.5', true, 'leading dot'],
  ['5.', '5', true, 'trailing period'],
  ['1.50', '1.5', true, 'trailing zero'],
  // percent (a % side matches both n and n/100)
  ['10%', '0.1', true, 'percent as a rate'],
  ['10\\%', '10', true, 'percent sign dropped'],
  ['50%', '1/2', true, 'percent vs fraction'],
  ['10%', '0.2', false, 'wrong percent'],
  ['10', '0.1', false, 'no % sign: no percent reading'],
  // expressions
  ['2^3', '8', true, 'power'],
  ['2^{10}', '1024', true, 'braced exponent'],
  ['\\sqrt{4}', '2', true, 'perfect square root'],
  ['\\sqrt{2}', '1.41421356', true, 'irrational vs decimal, rounded to 6 places'],
  ['\\sqrt{2}', '1.414', false, 'irrational vs a too-rough decimal'],
  ['\\frac{\\sqrt{2}}{2}', '\\frac{1}{\\sqrt{2}}', true, 'rationalised denominator'],
  ['2\\sqrt{3}', '\\sqrt{12}', true, 'implicit product'],
  ['\\sqrt[3]{27}', '3', true, 'cube root'],
  ['3\\cdot 4', '12', true, '\\cdot'],
  ['3 \\times 4', '12', true, '\\times'],
  ['3×4', '12', true, 'Unicode times'],
  ['\\left(1+2\\right)\\cdot 3', '9', true, '\\left( \\right)'],
  ['(1+2)(3+4)', '21', true, 'implicit product of groups'],
  ['2\\pi', '6.283185307', true, 'pi within tolerance'],
  ['\\pi', '3.14', false, 'pi is not 3.14'],
  ['\\pi', '3.14159', false, 'rounded to 6 places 3.141593 ≠ 3.14159 (math-verify agrees)'],
  ['\\pi', '3.141593', true, 'six places of pi'],
  ['\\sqrt{8}', '2\\sqrt{2}', true, 'irrationals without decimals: equal to 1e-10'],
  ['\\pi', '3.1416', false, '5 significant digits are not'],
  ['\\pi/2', '\\frac{\\pi}{2}', true, 'pi in a fraction'],
  ['1/0', '1/0', true, 'division by zero falls back to identical text'],
  ['2^-1', '0.5', true, 'negative exponent'],
  ['−3', '-3', true, 'Unicode minus'],
  // wrappers and decorations
  ['$\\frac{1}{2}$', '0.5', true, 'inline math delimiters'],
  ['\\(5\\)', '5', true, '\\( \\) delimiters'],
  ['\\boxed{\\frac{1}{2}}', '0.5', true, 'boxed wrapper with nested braces'],
  ['5\\text{ cm}', '5', true, 'unit in \\text'],
  ['5 \\text{cm}^2', '5', true, 'squared unit'],
  ['5 cm', '5', true, 'plain unit word'],
  ['90^\\circ', '90', true, 'degrees'],
  ['\\$5.00', '5', true, 'dollar sign'],
  ['x = 5', '5', true, 'assignment'],
  ['x_1 = \\frac12', '0.5', true, 'subscripted assignment'],
  ['\\text{Yes}', 'yes', true, 'text answer, case-insensitive'],
  ['\\text{(B)}', '(B)', true, 'multiple-choice letter'],
  ['(B)', '(C)', false, 'different choices'],
  ['(B)', 'B', true, 'a choice letter with or without parentheses'],
  ['$\\frac{1}{2}$.', '0.5', true, 'period after the closing $'],
  ['\\approx 3.5', '7/2', true, 'leading \\approx'],
  ['1/2, 1/3', '\\frac13, \\frac12', true, 'bare list of fractions'],
  ['10^{-3}', '0.001', true, 'negative power of ten'],
  ['1.5\\times10^{3}', '1500', true, 'scientific notation in LaTeX'],
  ['4^{1/2}', '2', true, 'fractional exponent of a perfect square'],
  ['2\\frac{3}{2}', '7/2', true, 'an integer before \\frac of two integers is a mixed number, as math-verify reads it'],
  ['\\$1,000', '1000', true, 'escaped dollar and thousands separator'],
  ['x^2 + 1', 'x^{2}+1', true, 'whitespace and braces in a non-numeric answer'],
  ['x^2+1', '1+x^2', true, 'the same polynomial'],
  ['(x+1)^2', 'x^2+2x+1', true, 'expanded square'],
  ['x^2+1', 'x^2-1', false, 'different polynomials'],
  ['x+1', 'y+1', false, 'variables matter'],
  ['\\infty', '\\infty', true, 'symbol'],
  // tuples, intervals, sets
  ['(1, \\frac{1}{2})', '(1,0.5)', true, 'ordered pair element-wise'],
  ['(1, 2)', '(2, 1)', false, 'ordered pair order matters'],
  ['[1, 2)', '[1,2)', true, 'half-open interval'],
  ['[1, 2)', '(1, 2)', false, 'interval brackets matter'],
  ['(-\\infty, 0.5]', '\\left(-\\infty, \\frac12\\right]', true, 'infinite interval'],
  ['\\{1, 2, 3\\}', '\\{3, 2, 1\\}', true, 'sets ignore order'],
  ['1, 2', '2, 1', true, 'bare list of solutions ignores order'],
  ['1, 2', '1, 2, 3', false, 'different list lengths'],
  ['(x=1, y=2)', '(y=1, x=2)', false, 'variables inside a tuple are kept'],
  // junk
  ['', '5', false, 'empty answer'],
  ['five', '5', false, 'words are not numbers'],
  ['\\frac{1}{2', '0.5', false, 'unbalanced braces'],
];

describe('answer equivalence table', () => {
  it.each(TABLE)('%s vs %s → %s (%s)', (predicted, reference, expected) => {
    expect(answersEquivalent(predicted, reference)).toBe(expected);
    expect(answersEquivalent(reference, predicted)).toBe(expected);
  });

  it('reports which rule decided', () => {
    expect(checkEquivalence('0.5', '\\frac12').method).toBe('rounded');
    expect(checkEquivalence('\\frac24', '\\frac12').method).toBe('rational');
    expect(checkEquivalence('x^2', 'x \\cdot x').method).toBe('symbolic');
    expect(checkEquivalence('x > 3', '3 < x').method).toBe('relation');
    expect(checkEquivalence('\\sqrt2', '1.41421356').method).toBe('rounded');
    expect(checkEquivalence('\\sqrt8', '2\\sqrt2').method).toBe('tolerance');
    expect(checkEquivalence('\\text{Yes}', 'yes').method).toBe('text');
    expect(checkEquivalence('(1,0.5)', '(1, \\frac12)').method).toBe('elements');
    expect(checkEquivalence('', '1').method).toBe('none');
  });
});

describe('answers made to be expensive', () => {
  it('keeps fractions exact up to 1024 bits and no further, so a repetition loop of powers is judged in milliseconds', () => {
    expect(rational(2n ** 1000n)).toMatchObject({ exact: true });
    expect(rational(2n ** 1100n, 3n ** 690n)).toMatchObject({ exact: false });
    // Out of the range of doubles too (2^1100 overflows, 3^-700 underflows): no float stands for them.
    expect(() => rational(2n ** 1100n)).toThrow(PrecisionLost);
    expect(() => rational(1n, 3n ** 700n)).toThrow(PrecisionLost); // too big however it reduces: no gcd taken
    expect(rational(6n ** 300n, 3n ** 300n)).toEqual({ exact: true, n: 2n ** 300n, d: 1n });
    const started = performance.now();
    // x^9x^9… (333 factors, the 1000-character cap): at 8192 bits every product's gcd was quadratic in its bits.
    expect(checkEquivalence('x^9'.repeat(333), 'x^2+2x+1').equivalent).toBe(false);
    expect(checkEquivalence('x^9'.repeat(333), 'x^9'.repeat(333)).equivalent).toBe(true);
    expect(performance.now() - started).toBeLessThan(2_000);
  });
});
