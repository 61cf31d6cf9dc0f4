import { parseNumber } from '../math/expression.js';
import { unwrapBoxed } from '../math/extract.js';
import { MIN_NORMAL, toFloat } from '../math/rational.js';
import type { Unit, UnitSystem } from './units.js';

/**
 * Reading numeric answers with units, and comparing them with a reference under a relative tolerance. Answers
 * are untrusted model output: every pattern here is anchored or linear, inputs are capped, nothing throws.
 */

/** Longest answer text considered; longer ones are not read as numbers. */
const MAX_QUANTITY_TEXT = 500;

/** A number with what followed it. */
export interface Quantity {
  value: number;
  /** A % sign followed the number (`value` is the number as written: 45 for "45%"). */
  percent: boolean;
  /** The unit as written after the number ('' when none). */
  unitText: string;
}

const SUPERSCRIPT_DIGITS: Record<string, string> = { '⁻': '-', '⁺': '+', '⁰': '0', '¹': '1', '²': '2', '³': '3', '⁴': '4', '⁵': '5', '⁶': '6', '⁷': '7', '⁸': '8', '⁹': '9' };

/**
 * The number: sign, digits with optional "," thousands groups (1,234,567), decimals, an optional "/denominator",
 * then an exponent: e-notation (6.02e23), "× 10^-3" / "x10^{-3}" / "*10**-3" / "·10⁻³", or a power "^n".
 */
const NUMBER =
  /^([+-])?\s*((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:\s*\/\s*(\d+(?:\.\d+)?))?(?:\s*[eE]\s*([+-]?\d+)|\s*(?:[×x*·⋅]|\\times|\\cdot)\s*10\s*(?:\^|\*\*)\s*\(?\s*([+-]?\d+)\s*\)?|\s*(?:\^|\*\*)\s*\(?\s*([+-]?\d+(?:\.\d+)?)\s*\)?)?/;

/** Text clean-up before reading a number: TeX delimiters and spacing, Unicode minus and superscripts, \frac. */
function clean(text: string): string {
  let s = unwrapBoxed(text.trim())
    .replace(/\$/g, '')
    .replace(/^\\[([]/, '')
    .replace(/\\[)\]]$/, '')
    .replace(/[−–]/g, '-')
    .replace(/\\%/g, '%')
    .replace(/\\(?:left|right)\b/g, '')
    .replace(/\\[dt]?frac\s*\{\s*([\d.]+)\s*\}\s*\{\s*([\d.]+)\s*\}/g, '$1/$2')
    .replace(/[⁻⁺⁰¹²³⁴⁵⁶⁷⁸⁹]+/g, (m) => `^${[...m].map((c) => SUPERSCRIPT_DIGITS[c]).join('')}`)
    .replace(/(\d)(?:\\,|\\ |[\u2009\u202f\u00a0])(?=\d{3}(?!\d))/g, '$1')
    .replace(/\^\s*\{\s*([+-]?\d+)\s*\}/g, '^$1')
    .trim();
  // "v = 3.0 m/s", "x \approx 2": the value is what follows the last relation sign. "x = 3 or x = 4", "v = 3 m/s, t = 4
  // s": two statements (the last was read and scored), so no value.
  const statements = s.split(/=|≈|\\approx/);
  if (statements.slice(1, -1).some((between) => /\b(?:or|and)\b|[,;](?!\d{3})/i.test(between))) return '';
  const relation = Math.max(s.lastIndexOf('='), s.lastIndexOf('≈'), s.lastIndexOf('\\approx'));
  if (relation >= 0) s = s.slice(relation).replace(/^(?:=|≈|\\approx)/, '');
  return s.replace(/[\s.,;:!]+$/, '').trim();
}

/** Math around a number that only the arithmetic reading understands: a root, fraction, function or power before it. */
const MATH_COMMAND = String.raw`\\(?:sqrt|[dt]?frac|pi|ln|log|exp|sin|cos|tan|cot|sec|csc|arc[a-z]+|sinh|cosh|tanh)(?![a-zA-Z])`;
const MATH_BEFORE = new RegExp(`${MATH_COMMAND}|\\^`);
/**
 * ... or a power, a factorial, such a command, or the rest of a decimal cut off (a power read as an integer: "2**0.5")
 * right after it ("2^{x}", "3\pi r", "100\ln 2").
 */
const MATH_AFTER = new RegExp(`^(?:[\\^!]|\\*\\*|\\.\\d|${MATH_COMMAND})`);

/**
 * ... or another number after it, alone or joined to it ("3 4", "3 or 4", "3, 4", "3 to 4", "between 3 and 4"):
 * candidates, not an answer (the first of them was read and scored). A measurement's uncertainty ("5 ± 0.1 m") is one
 * value.
 */
const ANOTHER_NUMBER = /^(?:(?:[,;]|\(?\s*(?:\\(?:text|textrm|mathrm|mbox)\s*\{\s*)?(?:or|and|to)\b\s*\}?)\s*)?[+-]?\s*(?:\d|\.\d)/i;

/**
 * The first number in `text` and the unit after it: "9.8 m/s^2", "-1.2e-3 kg", "3.0 × 10^{8}\,\mathrm{m\,s^{-1}}",
 * "1,200 J", "45%", "x = 3/4". Words before the number are skipped ("approximately 5 km"). An answer that is arithmetic
 * as a whole ("\sqrt{2}", "3\pi", "2^{1/2}", "\frac{\pi}{4}") is its value, without a unit. Undefined when there is no
 * number, the number stands inside math that is not read ("\sqrt{2x}": not 2), or another follows it ("3 or 4").
 */
export function parseQuantity(text: string): Quantity | undefined {
  if (text.length > MAX_QUANTITY_TEXT) return undefined;
  const s = clean(text);
  // A digit in a word ("H2O: 18 g/mol", "CO2 is 44 g/mol") is part of a name, not the number.
  const start = s.search(/(?<![A-Za-z0-9_.])[+-]?\s*(?:\d|\.\d)/);
  if (start < 0) return undefined;
  const m = NUMBER.exec(s.slice(start));
  if (!m) return undefined;
  // "\sqrt{2}", "3\pi", "2^{1/2}", "e^{2}": the first literal is not the number. The whole is read as arithmetic by the
  // math environment's evaluator (no unit then); when it is not, a literal inside math it cannot read is no number.
  const after = s.slice(start + m[0].length).trim();
  if ((after !== '' || start > 0) && !s.includes('%')) {
    const arithmetic = parseNumber(s);
    if (arithmetic) {
      const value = toFloat(arithmetic.value);
      return Number.isFinite(value) && (value === 0 || Math.abs(value) >= MIN_NORMAL) ? { value, percent: false, unitText: '' } : undefined;
    }
  }
  if (MATH_BEFORE.test(s.slice(0, start)) || MATH_AFTER.test(after) || ANOTHER_NUMBER.test(after)) return undefined;
  const [whole, sign, mantissa = '', denominator, eExponent, tenExponent, power] = m;
  let value = Number(mantissa.replace(/,/g, ''));
  if (denominator !== undefined) value /= Number(denominator);
  const exponent = eExponent ?? tenExponent;
  if (exponent !== undefined) value *= 10 ** Number(exponent);
  else if (power !== undefined) value **= Number(power);
  if (sign === '-') value = -value;
  if (!Number.isFinite(value)) return undefined;
  // A nonzero number that underflows ("1 × 10^{-400}" is the float 0, a subnormal keeps few digits) is no number at
  // all: read as 0 it matched a reference of 0.
  if (value === 0 ? /[1-9]/.test(mantissa) : Math.abs(value) < MIN_NORMAL) return undefined;
  let rest = s.slice(start + whole.length).trim();
  const percent = rest.startsWith('%');
  if (percent) rest = rest.slice(1).trim();
  return { value, percent, unitText: rest };
}

/** The reference of a numeric question, prepared once per instance. */
export interface NumericReference {
  value: number;
  percent: boolean;
  /** The reference's unit as given ('' when none) and, when the unit system knows it, parsed. */
  unitText: string;
  unit: Unit | undefined;
  /** Relative tolerance: |answer − reference| ≤ tolerance · |reference|. */
  tolerance: number;
}

/** How a numeric comparison went: the verdict, the rule that decided, and the answer in the reference's unit. */
export interface NumericVerdict {
  correct: boolean;
  /** 'no_number' | 'unit_mismatch' (incompatible dimensions) | 'within_tolerance' | 'outside_tolerance'. */
  reason: 'no_number' | 'unit_mismatch' | 'within_tolerance' | 'outside_tolerance';
  /** The answer converted to the reference's unit (when it had a number and a compatible unit). */
  converted?: number;
  /** Whether the answer's unit was converted (false: none given, the same, or not understood and so ignored). */
  unitConverted?: boolean;
}

/** Float slack under any tolerance: unit factors such as 0.0254 are not exact in binary. */
const FLOAT_SLACK = 1e-9;

function close(a: number, b: number, tolerance: number): boolean {
  return Math.abs(a - b) <= Math.max(tolerance, FLOAT_SLACK) * Math.abs(b) || a === b;
}

/**
 * Compares an answer with the reference:
 * 1. Units. A reference without a unit ignores the answer's unit words. Otherwise an answer without a unit is
 *    taken in the reference's unit; one with a unit both sides' unit system understands is converted ("5 km" vs
 *    5000 m), and incompatible dimensions are wrong; a unit either side does not understand is ignored (the
 *    numbers are compared as they are, as "5 apples" reads 5).
 * 2. Percent. "45%" is 45 or 0.45, whichever the other side means (datasets store both), as in the math
 *    environment: a side with a % matches with the sign dropped or divided by 100.
 * 3. Tolerance. |answer − reference| ≤ tolerance · |reference| (a reference of 0 needs exactly 0).
 */
export function compareQuantity(answer: string, reference: NumericReference, units: UnitSystem): NumericVerdict {
  const q = parseQuantity(answer);
  if (!q) return { correct: false, reason: 'no_number' };
  let value = q.value;
  let unitConverted = false;
  if (reference.unitText !== '' && q.unitText !== '') {
    const unit = units.parse(q.unitText);
    if (unit && reference.unit) {
      const converted = units.convert(q.value, unit, reference.unit);
      if (converted === undefined) return { correct: false, reason: 'unit_mismatch' };
      unitConverted = converted !== q.value;
      value = converted;
    }
    // Otherwise a side's unit is not understood: it is ignored and the numbers are compared as they are.
  }
  const answers = q.percent ? [value, value / 100] : [value];
  const references = reference.percent ? [reference.value, reference.value / 100] : [reference.value];
  const correct = answers.some((a) => references.some((r) => close(a, r, reference.tolerance)));
  return { correct, reason: correct ? 'within_tolerance' : 'outside_tolerance', converted: value, unitConverted };
}
