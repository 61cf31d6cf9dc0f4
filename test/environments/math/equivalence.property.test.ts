import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { answersEquivalent } from '../../../src/environments/math/equivalence.js';

/** Integers in forms a model or a dataset might write them. */
function integerForms(n: bigint): string[] {
  const abs = n < 0n ? -n : n;
  const sign = n < 0n ? '-' : '';
  const grouped = abs.toString().replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  return [
    n.toString(),
    `${sign}${grouped}`,
    `${n}.0`,
    `${n}.000`,
    `${n}e0`,
    `\\frac{${3n * n}}{3}`,
    `${7n * n}/7`,
    `\\dfrac{${-2n * n}}{-2}`,
    `$${n}$`,
    `\\boxed{${n}}`,
    `x = ${n}`,
    `${n}.`,
  ];
}

const MATHY = fc.string({
  unit: fc.constantFrom(...'0123456789.,-+*/^()[]{}%$=\\ xeE'.split(''), '\\frac', '\\sqrt', '\\pi', '\\boxed', '\\text', '\\{', '\\}', '\\left(', '\\right)', '\\cdot'),
  maxLength: 40,
});
const ANY = fc.oneof(fc.string({ maxLength: 60 }), fc.string({ unit: 'binary', maxLength: 60 }), MATHY);

describe('answer equivalence properties', () => {
  it('an integer equals each of its written forms', () => {
    fc.assert(
      fc.property(fc.bigInt({ min: -(10n ** 30n), max: 10n ** 30n }), fc.nat(11), fc.nat(11), (n, i, j) => {
        const forms = integerForms(n);
        expect(answersEquivalent(forms[i]!, forms[j]!)).toBe(true);
        const safe = n >= -(2n ** 53n) && n <= 2n ** 53n;
        expect(answersEquivalent(forms[i]!, safe ? Number(n) : n.toString())).toBe(true);
      }),
    );
  });

  it('a terminating decimal equals its fraction', () => {
    fc.assert(
      fc.property(fc.integer({ min: -1_000_000, max: 1_000_000 }), fc.integer({ min: 0, max: 8 }), (p, k) => {
        const q = 10 ** k;
        const abs = Math.abs(p).toString().padStart(k + 1, '0');
        const decimal = `${p < 0 ? '-' : ''}${k === 0 ? abs : `${abs.slice(0, -k)}.${abs.slice(-k)}`}`;
        expect(answersEquivalent(decimal, `\\frac{${p}}{${q}}`)).toBe(true);
        expect(answersEquivalent(decimal, `${p}/${q}`)).toBe(true);
      }),
    );
  });

  it('different integers are not equivalent', () => {
    fc.assert(
      fc.property(fc.bigInt(), fc.bigInt(), (a, b) => {
        fc.pre(a !== b);
        expect(answersEquivalent(a.toString(), b.toString())).toBe(false);
      }),
    );
  });

  it('is symmetric', () => {
    fc.assert(
      fc.property(ANY, ANY, (a, b) => {
        expect(answersEquivalent(a, b)).toBe(answersEquivalent(b, a));
      }),
      { numRuns: 2000 },
    );
  });

  it('is reflexive for non-blank answers', () => {
    fc.assert(
      fc.property(ANY, (a) => {
        fc.pre(a.trim() !== '');
        expect(answersEquivalent(a, a)).toBe(true);
      }),
      { numRuns: 1000 },
    );
  });

  it('never throws and stays fast on arbitrary and long input', () => {
    const long = fc.string({ unit: fc.constantFrom('(', ')', '{', '}', '\\frac', '\\sqrt', '^', '9', ',', '\\{', '\\}', ' ', '$', '\\boxed{', '='), maxLength: 1200 });
    fc.assert(
      fc.property(fc.oneof(ANY, long), fc.oneof(ANY, long), (a, b) => {
        const start = performance.now();
        expect(() => answersEquivalent(a, b)).not.toThrow();
        expect(performance.now() - start).toBeLessThan(1000);
      }),
      { numRuns: 1000 },
    );
  });
});
