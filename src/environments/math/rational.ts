/**
 * Numbers for answer checking: exact rationals (bigint numerator/denominator) when every step of a
 * computation is rational, floats otherwise (square roots of non-squares, π, huge powers).
 *
 * Why exact: graders that compare floats with a tolerance call "0.333" and "1/3" different only by luck of
 * the tolerance, and call "0.3333333" and "1/3" equal. With rationals the answer either is the number or is not.
 * Sizes are capped ({@link MAX_BITS}) so adversarial input ("9^9^9^9") degrades to a float, never to a hang.
 *
 * A float carries `err`, a bound on its distance from the true value, carried through every operation (each
 * rounding adds one, and an input's error is scaled by how much the operation stretches it). It lets a float
 * that should be 0 (\sin^2 x + \cos^2 x - 1, computed as 1e-16) equal 0 without calling every small value 0: e^{-30}
 * is 9e-14 with an error near 1e-27, so it is not 0. A value that leaves the range of doubles (an overflow to
 * Infinity, or a nonzero value that underflows to 0 or to a subnormal) has no such bound: the operation throws
 * {@link PrecisionLost}, and the caller must not compare it at all. Before, 10^{-400} was the float 0 and equal
 * to 0, and 1 + x^{3000} equal to 1 (at x > 1 it overflowed and the point was skipped as undefined, at x < 1 the
 * power vanished).
 */
export type Num =
  | { readonly exact: true; readonly n: bigint; readonly d: bigint }
  | { readonly exact: false; readonly x: number; readonly err: number };

/** The value left the range of doubles (overflow, or underflow of a nonzero value): no float stands for it. */
export class PrecisionLost extends Error {}

/** Twice the unit roundoff: a generous bound on one rounding (or a 1-ulp library function), relative to the result. */
const EPS = 2 ** -52;
/** Smallest positive double with full precision (below it, subnormals keep few digits). */
export const MIN_NORMAL = 2 ** -1022;

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

/** An exact rational, reduced, with a positive denominator (a float past MAX_BITS). Throws on d = 0 (callers check first), and PrecisionLost when it is past MAX_BITS and out of the range of doubles. */
export function rational(n: bigint, d: bigint = ONE): Num {
  if (d === ZERO) throw new RangeError('zero denominator');
  if (d < ZERO) {
    n = -n;
    d = -d;
  }
  // Too big to be kept whatever the gcd: the reduced numerator (denominator) keeps at least its bits minus the other's.
  const [bn, bd] = [bitLength(n), bitLength(d)];
  if (bn - bd > MAX_BITS + 4 || bd - bn > MAX_BITS + 4) return rationalAsFloat(n, d);
  const g = gcd(n, d);
  if (g > ONE) {
    n /= g;
    d /= g;
  }
  if (bitLength(n) > MAX_BITS || bitLength(d) > MAX_BITS) return rationalAsFloat(n, d);
  return { exact: true, n, d };
}

/**
 * A float value: the result of anything irrational, or of an exact value that outgrew {@link MAX_BITS}. `err` bounds
 * its distance from the true value (default: one rounding). Throws {@link PrecisionLost} when x or err is not finite
 * or x is subnormal (gradual underflow keeps fewer bits than `err` accounts for).
 */
export function real(x: number, err = Math.abs(x) * EPS): Num {
  if (!Number.isFinite(x) || !Number.isFinite(err) || (x !== 0 && Math.abs(x) < MIN_NORMAL)) throw new PrecisionLost();
  return { exact: false, x, err };
}

/** A float result of an operation on nonzero operands, which must itself be nonzero: 0 then means an underflow. */
function nonzeroReal(x: number, err: number): Num {
  if (x === 0) throw new PrecisionLost();
  return real(x, err);
}

/** The error bound of a value used as a float: an exact one is off by its conversion only (none for small integers). */
export function errorOf(a: Num): number {
  if (!a.exact) return a.err;
  if (a.d === ONE && bitLength(a.n) <= 52) return 0;
  return Math.abs(toFloat(a)) * 2 * EPS;
}

/** n/d (too big to keep exact) as a float: a few roundings, or PrecisionLost when it is out of the range of doubles. */
function rationalAsFloat(n: bigint, d: bigint): Num {
  const x = ratioToFloat(n, d);
  return n === ZERO ? real(0, 0) : nonzeroReal(x, Math.abs(x) * 2 * EPS);
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
  return a.exact ? { exact: true, n: -a.n, d: a.d } : { exact: false, x: -a.x, err: a.err };
}

/** |a|, with the error of a. */
export function absolute(a: Num): Num {
  if (a.exact) return a.n < ZERO ? neg(a) : a;
  return { exact: false, x: Math.abs(a.x), err: a.err };
}

/** a + b; exact when both are exact, a float otherwise (the same holds for sub and mul). */
export function add(a: Num, b: Num): Num {
  if (a.exact && b.exact) return rational(a.n * b.d + b.n * a.d, a.d * b.d);
  const x = toFloat(a) + toFloat(b);
  return real(x, errorOf(a) + errorOf(b) + Math.abs(x) * EPS);
}

/** a − b. */
export function sub(a: Num, b: Num): Num {
  return add(a, neg(b));
}

/**
 * (n1/d1)·(n2/d2) for reduced fractions with positive denominators, cancelled crosswise first (n1 with d2, n2 with
 * d1): the product is then reduced already, and each gcd has one small side in a long product such as x·x·x·… (the
 * gcd of the whole product, quadratic in its bits, made a 1000-letter answer cost about 10 ms per evaluation).
 */
function reducedProduct(n1: bigint, d1: bigint, n2: bigint, d2: bigint): Num {
  const g1 = gcd(n1, d2);
  const g2 = gcd(n2, d1);
  const n = (n1 / g1) * (n2 / g2);
  const d = (d1 / g2) * (d2 / g1);
  if (bitLength(n) > MAX_BITS || bitLength(d) > MAX_BITS) return rationalAsFloat(n, d);
  return { exact: true, n, d };
}

/** a · b. */
export function mul(a: Num, b: Num): Num {
  if (a.exact && b.exact) return reducedProduct(a.n, a.d, b.n, b.d);
  const [x, y, ex, ey] = [toFloat(a), toFloat(b), errorOf(a), errorOf(b)];
  const err = Math.abs(x) * ey + Math.abs(y) * ex + ex * ey + Math.abs(x * y) * EPS;
  return x === 0 || y === 0 ? real(x * y, err) : nonzeroReal(x * y, err);
}

/**
 * Division; undefined when dividing by zero (the caller treats the answer as non-numeric). A float divisor whose
 * error reaches its size (it might be 0) gives no bounded quotient: PrecisionLost.
 */
export function div(a: Num, b: Num): Num | undefined {
  if (isZero(b)) return undefined;
  if (a.exact && b.exact) return b.n < ZERO ? reducedProduct(a.n, a.d, -b.d, -b.n) : reducedProduct(a.n, a.d, b.d, b.n);
  const [x, y, ex, ey] = [toFloat(a), toFloat(b), errorOf(a), errorOf(b)];
  if (ey >= Math.abs(y) / 2) throw new PrecisionLost();
  const q = x / y;
  const err = (ex + Math.abs(q) * ey) / (Math.abs(y) - ey) + Math.abs(q) * EPS;
  return x === 0 ? real(q, err) : nonzeroReal(q, err);
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
  const r = Math.sign(x) * Math.pow(Math.abs(x), 1 / k);
  const e = errorOf(a);
  // Near 0 (|x| within its error) the root is only known to lie below the root of |x| + e.
  if (e >= Math.abs(x) / 2) return real(r, Math.abs(r) + Math.pow(Math.abs(x) + e, 1 / k));
  // (1 ± ρ)^{1/k} is within ρ/k/(1-ρ) of 1, plus the rounding of pow (1/k itself is rounded: a few ulps).
  const rho = e / Math.abs(x);
  return nonzeroReal(r, Math.abs(r) * (rho / k / (1 - rho) + 4 * EPS));
}

/**
 * a^b. Exact for rational a and integer b while the result stays under {@link MAX_BITS}; exact roots for
 * exponents 1/2 and 1/3 of perfect powers; a float otherwise. Undefined for 0^negative and even roots of negatives.
 */
export function pow(a: Num, b: Num): Num | undefined {
  // x^0 is exactly 1 for a float base too (as Math.pow has it): not a float 1 with an error, which \arcsin would refuse.
  if (b.exact && b.n === ZERO) return rational(ONE);
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
  const [x, y, ex, ey] = [toFloat(a), toFloat(b), errorOf(a), errorOf(b)];
  const r = Math.pow(x, y);
  if (Number.isNaN(r)) return undefined;
  if (x === 0 && ex === 0) return y > 0 ? real(0, 0) : undefined;
  if (ex >= Math.abs(x) / 2) {
    // A base near 0 (within its error): for a positive exponent the power lies below (|x| + e)^(smallest exponent).
    const bound = Math.abs(x) + ex;
    const lowest = bound <= 1 ? y - ey : y + ey;
    if (y - ey <= 0) throw new PrecisionLost();
    return real(r, Math.abs(r) + Math.pow(bound, lowest));
  }
  // ln|r| = y·ln|x| is off by |y|·ρ/(1-ρ) + |ln|x||·ey (+ ey·ρ): r by expm1 of that, plus pow's own few ulps.
  const rho = ex / Math.abs(x);
  const spread = (Math.abs(y) + ey) * (rho / (1 - rho)) + Math.abs(Math.log(Math.abs(x))) * ey;
  return nonzeroReal(r, Math.abs(r) * (Math.expm1(spread) + 4 * EPS));
}

/**
 * Relative tolerance used when at least one side is not an exact rational and neither was written with a decimal
 * point: math-verify compares such values to 15 significant digits (sympy's evalf), floats hold about 16, so
 * 1e-10 accepts \sqrt{8} = 2\sqrt{2} computed in floats and nothing a person would call a different number.
 */
export const RELATIVE_TOLERANCE = 1e-10;
/**
 * Most that the carried error bounds may add to the tolerance: a float that should be 0 (√2 − √2, \sin^2 x +
 * \cos^2 x − 1 computed in floats) is within its error of 0, but a large error bound (a cancellation of huge terms,
 * \tan near a pole) must not make a value equal to everything near it. This was the absolute floor alone, which
 * called every value under 1e-12 equal to 0 (e^{-30} = 0).
 */
const ABSOLUTE_TOLERANCE = 1e-12;
/** Factor on the carried error bounds (they are bounds of the first order; this keeps them bounds). */
const ERROR_MARGIN = 4;

/**
 * Exact equality for two rationals; otherwise |a − b| ≤ tolerance·max(|a|,|b|) plus their error bounds (capped at
 * 1e-12): so the result is never more lenient than the relative tolerance with an absolute floor of 1e-12. Symmetric.
 */
export function numbersEqual(a: Num, b: Num, tolerance = RELATIVE_TOLERANCE): boolean {
  if (a.exact && b.exact) return a.n === b.n && a.d === b.d;
  const x = toFloat(a);
  const y = toFloat(b);
  if (!Number.isFinite(x) || !Number.isFinite(y)) return false;
  const diff = Math.abs(x - y);
  const slack = Math.min(ABSOLUTE_TOLERANCE, ERROR_MARGIN * (errorOf(a) + errorOf(b)));
  return diff <= slack || diff <= tolerance * Math.max(Math.abs(x), Math.abs(y)) + slack;
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
