import { describe, expect, it } from 'vitest';
import { compareQuantity, parseQuantity, type NumericReference } from '../../../src/environments/stem/quantity.js';
import { mathjsUnits } from '../../../src/environments/stem/units.js';

const ref = (value: number, unitText = ''): NumericReference => ({ value, unitText, unit: mathjsUnits.parse(unitText), tolerance: 0.01, percent: false });

/**
 * A nonzero number too small for a double was read as the float 0 ("1 × 10^{-400}", "0.5^{2000}"), which equals a
 * reference of 0 exactly: a wrong answer scored. It is no number now (reason no_number), and so is a subnormal one.
 */
describe('stem numbers that underflow', () => {
  it.each(['1 \\times 10^{-400}', '5e-400', '0.5^{2000}', '3e-320', '2 \\times 10^{-400} m'])('%s is not read as 0', (answer) => {
    expect(parseQuantity(answer)).toBeUndefined();
    expect(compareQuantity(answer, ref(0), mathjsUnits)).toMatchObject({ correct: false, reason: 'no_number' });
    expect(compareQuantity(answer, ref(0, 'm'), mathjsUnits).correct).toBe(false);
  });

  it('still reads 0, small normal numbers and their units', () => {
    expect(compareQuantity('0', ref(0), mathjsUnits).correct).toBe(true);
    expect(compareQuantity('0.0 m', ref(0, 'm'), mathjsUnits).correct).toBe(true);
    expect(parseQuantity('1.6 \\times 10^{-300} kg')).toEqual({ value: 1.6e-300, percent: false, unitText: 'kg' });
    expect(compareQuantity('6.626e-34 J s', ref(6.626e-34, 'J s'), mathjsUnits).correct).toBe(true);
  });
});
