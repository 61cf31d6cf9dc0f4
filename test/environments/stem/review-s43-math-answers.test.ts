import { describe, expect, it } from 'vitest';
import { compareQuantity, parseQuantity, type NumericReference } from '../../../src/environments/stem/quantity.js';
import { createStemEnvironment } from '../../../src/environments/stem/stem-environment.js';
import { mathjsUnits } from '../../../src/environments/stem/units.js';
import { FakeSandbox } from '../fake-sandbox.js';

const ref = (value: number, unitText = ''): NumericReference => ({ value, unitText, unit: mathjsUnits.parse(unitText), tolerance: 0.01, percent: false });

/**
 * A numeric answer written as math was read as its first literal: "\sqrt{2}" was 2, "3\pi" 3, "2^{1/2}" 2, "e^{2}" 2,
 * "\frac{\pi}{4}" 4, "2^0.5" 1 (the power read as 0) — a wrong answer scored whenever that literal was the reference,
 * and the right one scored 0. Arithmetic as a whole is now read as its value; a literal inside math that is not read is
 * no number.
 */
describe('stem numeric answers written as math', () => {
  it.each([
    ['\\sqrt{2}', Math.SQRT2, 2],
    ['3\\pi', 3 * Math.PI, 3],
    ['2^{1/2}', Math.SQRT2, 2],
    ['e^{2}', Math.E ** 2, 2],
    ['\\frac{\\pi}{4}', Math.PI / 4, 4],
    ['2^0.5', Math.SQRT2, 1],
    ['2**0.5', Math.SQRT2, 1],
    ['\\ln 2', Math.LN2, 2],
    ['2 \\cdot 3', 6, 2],
  ])('%s is its value (%d), not its literal %d', (answer, value, literal) => {
    expect(parseQuantity(answer)?.value).toBeCloseTo(value, 12);
    expect(compareQuantity(answer, ref(value), mathjsUnits)).toMatchObject({ correct: true, reason: 'within_tolerance' });
    expect(compareQuantity(answer, ref(literal), mathjsUnits)).toMatchObject({ correct: false, reason: 'outside_tolerance' });
  });

  it.each([['\\sqrt{2x}', 2], ['3\\pi r', 3], ['100 \\ln 2 J', 100], ['10^10^10', 1e10], ['2^{x}', 2]])('%s is no number (it scored as %d)', (answer, literal) => {
    expect(parseQuantity(answer)).toBeUndefined();
    expect(compareQuantity(answer, ref(literal), mathjsUnits)).toMatchObject({ correct: false, reason: 'no_number' });
  });

  it('still reads numbers with units, scientific notation, fractions and percents as before', () => {
    expect(parseQuantity('3.0 \\times 10^{8} m/s')).toEqual({ value: 3e8, percent: false, unitText: 'm/s' });
    expect(parseQuantity('9.8 m/s^2')).toEqual({ value: 9.8, percent: false, unitText: 'm/s^2' });
    expect(parseQuantity('approximately 5 km')).toEqual({ value: 5, percent: false, unitText: 'km' });
    expect(parseQuantity('-\\frac{1}{2}')).toEqual({ value: -0.5, percent: false, unitText: '' });
    expect(parseQuantity('\\frac{1}{2}\\%')).toEqual({ value: 0.5, percent: true, unitText: '' });
    expect(parseQuantity('12 \\mathrm{m\\,s^{-2}}')).toMatchObject({ value: 12 });
  });

  it('scores them so in the environment, on its checker thread', async () => {
    const stem = createStemEnvironment();
    const score = async (reference: number, finishAnswer: string) =>
      stem.evaluate({
        instance: stem.validate({ question: 'q', answer: reference }),
        outcome: { messages: [], finishReason: 'finish_tool', finishAnswer },
        sandbox: new FakeSandbox(),
        signal: new AbortController().signal,
      });
    expect(await score(2, '\\sqrt{2}')).toMatchObject({ reward: 0, report: { reason: 'outside_tolerance' } });
    expect(await score(1.414, '\\sqrt{2}')).toMatchObject({ reward: 1, report: { reason: 'within_tolerance' } });
    expect(await score(3, '3\\pi')).toMatchObject({ reward: 0 });
  });
});

/**
 * An answer of several numbers was read as its first ("3 or 4", "3, 4", "between 3 and 4", "(3, 4)") or, after
 * relations, its last ("x = 3 or x = 4"): a list of candidates scored whenever the one read was the reference.
 */
describe('stem numeric answers of several numbers', () => {
  it.each([
    ['3 or 4', 3],
    ['3 \\text{ or } 4', 3],
    ['3, 4', 3],
    ['3 4', 3],
    ['3 to 4', 3],
    ['between 3 and 4', 3],
    ['3 (or 4) m', 3],
    ['\\{3, 4\\}', 3],
    ['(3, 4)', 3],
    ['x = 3 or x = 4', 4],
    ['x = 3, x = 4', 4],
    ['v = 3 m/s, t = 4 s', 4],
  ])('%s is no number (it scored as %d)', (answer, read) => {
    expect(parseQuantity(answer)).toBeUndefined();
    expect(compareQuantity(answer, ref(read), mathjsUnits)).toMatchObject({ correct: false, reason: 'no_number' });
  });

  it('still reads one value: an uncertainty, a chain of equalities, thousands groups, a unit spelled with a number', () => {
    expect(parseQuantity('5 ± 0.1 m')).toMatchObject({ value: 5 });
    expect(parseQuantity('F = ma = 5 N')).toEqual({ value: 5, percent: false, unitText: 'N' });
    expect(parseQuantity('E = 1,200 J = 1.2 kJ')).toEqual({ value: 1.2, percent: false, unitText: 'kJ' });
    expect(parseQuantity('1,234,567 J')).toEqual({ value: 1234567, percent: false, unitText: 'J' });
    expect(parseQuantity('9.8 m s^-2')).toEqual({ value: 9.8, percent: false, unitText: 'm s^-2' });
    expect(compareQuantity('x = 4', ref(4), mathjsUnits).correct).toBe(true);
  });
});

describe('stem numeric answers naming a formula first', () => {
  // The first digit was read wherever it stood: "H2O: 18 g/mol" was 2 g/mol... "U235 has 92 protons" 35.
  it.each([
    ['H2O: 18 g/mol', 18, 'g/mol'],
    ['CO2 is 44 g/mol', 44, 'g/mol'],
    ['U235 has 92 protons', 92, 'protons'],
  ])('%s is %d %s', (answer, value, unitText) => {
    expect(parseQuantity(answer)).toEqual({ value, percent: false, unitText });
  });

  it('scores the molar mass, not the subscript', () => {
    const reference: NumericReference = { value: 18, unitText: 'g/mol', unit: mathjsUnits.parse('g/mol'), tolerance: 0.01, percent: false };
    expect(compareQuantity('H2O: 18 g/mol', reference, mathjsUnits)).toMatchObject({ correct: true, converted: 18 });
    expect(compareQuantity('H2O: 2 g/mol', reference, mathjsUnits)).toMatchObject({ correct: false });
  });
});
