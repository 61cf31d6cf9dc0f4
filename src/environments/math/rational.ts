/**
 * Numbers for answer checking: exact rationals (bigint numerator/denominator) when every step of a
 * computation is rational, floats otherwise (square roots of non-squares, π, huge powers).
 *
 * Why exact: graders that compare floats with a tolerance call "0.333" and "1/3" different only by luck of
 * the tolerance, and call "0.3333333" and "1/3" equal. With rationals the answer either is the number or is not.
 * Sizes are capped ({@link MAX_BITS}) so adversarial input ("9^9^9^9") degrades to a float, never to a hang.
 */
export type Num =
  | { readonly exact: true; readonly n: bigint; readonly d: bigint }
  | { readonly exact: false; readonly x: number };

/**
 * Largest numerator/denominator kept exact (1024 bits: 308 digits); beyond it a value becomes a float. Reducing a
 * fraction costs a gcd quadratic in its bits, for every product of an expression evaluated at every test point:
 * at 8192 bits a 1000-character answer of repeated powers (`x^9x^9…`, a repetition loop) took 0.2-4 s.
 */
export const MAX_BITS = 1024;

const ZERO = 0n;
const ONE = 1n;

function abs(a: bigint): bigint {
  return a < ZERO ? -a : a;
}

function gcd(a: bigint, b: bigint): bigint {
  a = abs(a);
  b = abs(b);
  while (b !== ZERO) [a, b] = [b, a % b];
  return a;
}

/** Approximate bit length of |a| (exact to within 4 bits, which is all the caps need). */
export function bitLength(a: bigint): number {
  if (a === ZERO) return 0;
  return abs(a).toString(16).length * 4;
}

/** An exact rational, reduced, with a positive denominator. Throws only on d = 0 (callers check first). */
export function rational(n: bigint, d: bigint = ONE): Num {
  if (d === ZERO) throw new RangeError('zero denominator');
  if (d < ZERO) {
    n = -n;
    d = -d;
  }
  // Too big to be kept whatever the gcd: the reduced numerator (denominator) keeps at least its bits minus the other's.
  const [bn, bd] = [bitLength(n), bitLength(d)];
  if (bn - bd > MAX_BITS + 4 || bd - bn > MAX_BITS + 4) return real(ratioToFloat(n, d));
  const g = gcd(n, d);
  if (g > ONE) {
    n /= g;
    d /= g;
  }
  if (bitLength(n) > MAX_BITS || bitLength(d) > MAX_BITS) return real(ratioToFloat(n, d));
  return { exact: true, n, d };
}

/** A float value: the result of anything irrational, or of an exact value that outgrew {@link MAX_BITS}. */
export function real(x: number): Num {
  return { exact: false, x };
}

function ratioToFloat(n: bigint, d: bigint): number {
  const sn = Math.max(0, bitLength(n) - 64);
  const sd = Math.max(0, bitLength(d) - 64);
  return (Number(n >> BigInt(sn)) / Number(d >> BigInt(sd))) * 2 ** (sn - sd);
}

/** The nearest float (about 60 significant bits are used even for huge rationals, so no spurious Infinity). */
export function toFloat(a: Num): number {
  return a.exact ? ratioToFloat(a.n, a.d) : a.x;
}

/** Whether the value is zero (division guards on it). */
export function isZero(a: Num): boolean {
  return a.exact ? a.n === ZERO : a.x === 0;
}

/** Whether the value is an exact integer: only those make exact powers, root indices and mixed numbers. */
export function isInteger(a: Num): a is { exact: true; n: bigint; d: bigint } {
  return a.exact && a.d === ONE;
}

/** −a; exact stays exact. */
export function neg(a: Num): Num {
  return a.exact ? { exact: true, n: -a.n, d: a.d } : real(-a.x);
}

/** a + b; exact when both are exact, a float otherwise (the same holds for sub and mul). */
export function add(a: Num, b: Num): Num {
  if (a.exact && b.exact) return rational(a.n * b.d + b.n * a.d, a.d * b.d);
  return real(toFloat(a) + toFloat(b));
}

/** a − b. */
export function sub(a: Num, b: Num): Num {
  return add(a, neg(b));
}

/** a · b. */
export function mul(a: Num, b: Num): Num {
  if (a.exact && b.exact) return rational(a.n * b.n, a.d * b.d);
  return real(toFloat(a) * toFloat(b));
}

/** Division; undefined when dividing by zero (the caller treats the answer as non-numeric). */
export function div(a: Num, b: Num): Num | undefined {
  if (isZero(b)) return undefined;
  if (a.exact && b.exact) return rational(a.n * b.d, a.d * b.n);
  return real(toFloat(a) / toFloat(b));
}

/** The exact k-th root of a non-negative bigint, or undefined when it is not a perfect power (or too big to tell). */
function exactIntRoot(x: bigint, k: number): bigint | undefined {
  if (x === ZERO || x === ONE) return x;
  const guess = Math.round(Math.pow(Number(x), 1 / k));
  if (!Number.isFinite(guess)) return undefined;
  const kb = BigInt(k);
  for (let delta = -1; delta <= 1; delta++) {
    const r = BigInt(guess + delta);
    if (r >= ZERO && r ** kb === x) return r;
  }
  return undefined;
}

/** k-th root (k ≥ 2): exact when numerator and denominator are perfect powers, a float otherwise. */
export function root(a: Num, k: number): Num | undefined {
  if (!Number.isInteger(k) || k < 2) return undefined;
  const x = toFloat(a);
  if (x < 0 && k % 2 === 0) return undefined;
  if (a.exact) {
    const sign = a.n < ZERO ? -ONE : ONE;
    const n = exactIntRoot(abs(a.n), k);
    const d = exactIntRoot(a.d, k);
    if (n !== undefined && d !== undefined) return rational(sign * n, d);
  }
  return real(Math.sign(x) * Math.pow(Math.abs(x), 1 / k));
}

/**
 * a^b. Exact for rational a and integer b while the result stays under {@link MAX_BITS}; exact roots for
 * exponents 1/2 and 1/3 of perfect powers; a float otherwise. Undefined for 0^negative and even roots of negatives.
 */
export function pow(a: Num, b: Num): Num | undefined {
  if (a.exact && isInteger(b)) {
    const e = b.n;
    if (e === ZERO) return rational(ONE);
    if (a.n === ZERO) return e < ZERO ? undefined : rational(ZERO);
    const size = Math.max(bitLength(a.n), bitLength(a.d));
    if (abs(e) <= 100_000n && size * Number(abs(e)) <= MAX_BITS) {
      const p = abs(e);
      return e > ZERO ? rational(a.n ** p, a.d ** p) : rational(a.d ** p, a.n ** p);
    }
  }
  if (b.exact && b.n === ONE && (b.d === 2n || b.d === 3n)) return root(a, Number(b.d));
  const x = Math.pow(toFloat(a), toFloat(b));
  return Number.isNaN(x) ? undefined : real(x);
}

/**
 * Relative tolerance used when at least one side is not an exact rational and neither was written with a decimal
 * point: math-verify compares such values to 15 significant digits (sympy's evalf), floats hold about 16, so
 * 1e-10 accepts \sqrt{8} = 2\sqrt{2} computed in floats and nothing a person would call a different number.
 */
export const RELATIVE_TOLERANCE = 1e-10;
/** Absolute floor so that a float that should be 0 (e.g. √2 − √2 computed in floats) still equals 0. */
const ABSOLUTE_TOLERANCE = 1e-12;

/** Exact equality for two rationals; |a − b| ≤ tolerance·max(|a|,|b|) (or ≤ 1e-12) otherwise. Symmetric. */
export function numbersEqual(a: Num, b: Num, tolerance = RELATIVE_TOLERANCE): boolean {
  if (a.exact && b.exact) return a.n === b.n && a.d === b.d;
  const x = toFloat(a);
  const y = toFloat(b);
  if (!Number.isFinite(x) || !Number.isFinite(y)) return false;
  const diff = Math.abs(x - y);
  return diff <= ABSOLUTE_TOLERANCE || diff <= tolerance * Math.max(Math.abs(x), Math.abs(y));
}

/** Decimal places math-verify rounds to when either answer is written as a decimal (its float_rounding). */
export const DECIMAL_PLACES = 6;
const SCALE = 10n ** BigInt(DECIMAL_PLACES);

/** round(a · 10^6), half away from zero; exact for rationals; undefined for a float too large to round in a double. */
function scaledRound(a: Num): bigint | undefined {
  if (a.exact) {
    const sign = a.n < ZERO ? -ONE : ONE;
    return sign * ((2n * abs(a.n) * SCALE + a.d) / (2n * a.d));
  }
  const scaled = Math.abs(a.x) * 1e6;
  if (!Number.isFinite(scaled) || scaled >= 2 ** 52) return undefined;
  return BigInt(Math.sign(a.x) * Math.round(scaled));
}

/**
 * Whether a and b agree when both are rounded to {@link DECIMAL_PLACES} decimal places: math-verify's rule when an
 * answer is a decimal, so 0.333333 = 1/3 and 2.0 = 2 but 0.333 ≠ 1/3 and 3.14 ≠ π. Past 2^52·10^-6 (where a
 * double cannot hold the places) values fall back to {@link numbersEqual}. Symmetric.
 */
export function roundedEqual(a: Num, b: Num): boolean {
  const x = scaledRound(a);
  const y = scaledRound(b);
  if (x === undefined || y === undefined) return numbersEqual(a, b, 1e-15);
  return x === y;
}
