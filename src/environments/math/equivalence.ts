import { parseNumber, MAX_EXPRESSION_LENGTH } from './expression.js';
import { canonicalText, matchingClose, normalizeAnswer } from './normalize.js';
import { numbersEqual, type Num } from './rational.js';

/**
 * Deciding whether a model's final answer matches the reference. This is the reward of the math environment,
 * so it must be right in both directions (a false "wrong" teaches the model to avoid correct forms, a false
 * "right" rewards guessing), symmetric, and total: it never throws and never hangs on adversarial text.
 *
 * Rules, in order (each side normalised first, see {@link normalizeAnswer}):
 * 1. Numbers. Both sides parse as arithmetic (integers, "1,000", decimals, 1e3, fractions, \frac, \sqrt, ^,
 *    \cdot, \times, parentheses, mixed numbers, \pi) → equal when the values are equal: exactly when both
 *    are rationals (so 0.333 ≠ 1/3 and 0.5 = 1/2 = \frac12), within a relative 1e-6 when either is irrational.
 *    A trailing unit word after a number ("5 cm") is ignored.
 * 2. Percent. "50%" is ambiguous in datasets (a "what percent" answer is stored as 50, a rate as 0.5), so a
 *    side containing % matches both its value with the sign dropped (50) and divided by 100 (0.5). This makes
 *    the relation non-transitive (50 ~ 50% ~ 0.5 but 50 ≁ 0.5); it stays symmetric.
 * 3. Tuples, intervals and sets. "(1, \frac12)" vs "(1, 0.5)": same brackets and same number of top-level
 *    comma-separated parts → element-wise, in order; for \{…\} sets and bare lists "1, 2" the order is ignored.
 * 4. Text. Otherwise the canonical texts must match: whitespace removed, lower-cased, \left/\right, \!, \,
 *    removed, outer braces dropped: "\text{Yes}" = "yes", "x^{2} + 1" = "x^2+1", but "x^2+1" ≠ "1+x^2" (no algebra).
 *
 * Inputs longer than {@link MAX_ANSWER_LENGTH} characters are equal only when identical after trimming, and
 * nested lists stop being compared after a fixed number of element comparisons (then: not equivalent).
 */
export const MAX_ANSWER_LENGTH = MAX_EXPRESSION_LENGTH;

/** Which rule decided: useful in the evaluation report to see why an answer was (not) accepted. */
export type EquivalenceMethod = 'rational' | 'tolerance' | 'elements' | 'text' | 'none';

export interface EquivalenceResult {
  equivalent: boolean;
  method: EquivalenceMethod;
}

const MAX_ELEMENTS = 16;
const MAX_NESTING = 3;
/** Element comparisons allowed per call: nested lists multiply, and the cost must stay bounded. */
const MAX_COMPARISONS = 2000;

interface Budget {
  left: number;
}

interface Bracketed {
  open: string;
  close: string;
  parts: string[];
}

const PAIRS: ReadonlyArray<readonly [string, string]> = [
  ['\\{', '\\}'],
  ['(', ')'],
  ['[', ']'],
  ['(', ']'],
  ['[', ')'],
];

/** Splits at commas that are not inside (), [], {} — escaped \{ \} count as brackets here. */
function splitTopLevel(s: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    let c = s[i]!;
    if (c === '\\' && (s[i + 1] === '{' || s[i + 1] === '}')) c = s[++i]!;
    else if (c === '\\') continue;
    if (c === '(' || c === '[' || c === '{') depth++;
    else if (c === ')' || c === ']' || c === '}') depth--;
    else if (c === ',' && depth === 0) {
      parts.push(s.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(s.slice(start));
  return parts.map((p) => p.trim());
}

function bracketed(s: string): Bracketed | undefined {
  for (const [open, close] of PAIRS) {
    if (!s.startsWith(open) || !s.endsWith(close) || s.length < open.length + close.length) continue;
    const inner = s.slice(open.length, s.length - close.length);
    // "(1)(2)" is not one bracketed group; only check where plain brackets match each other.
    if (open === '(' && close === ')' && matchingClose(s, 0) !== s.length - 1) continue;
    if (open === '[' && close === ']' && matchingClose(s, 0) !== s.length - 1) continue;
    return { open, close, parts: splitTopLevel(inner) };
  }
  return undefined;
}

/** The values a normalised answer can mean: none if it is not arithmetic, two if it contains a %. */
function numericReadings(s: string): Num[] {
  let parsed = parseNumber(s, 'scale');
  let text = s;
  if (!parsed) {
    const unit = /^(.*?\S)\s+[a-zA-Z]{1,20}(?: [a-zA-Z]{1,20}){0,3}$/.exec(s.length <= 200 ? s : '');
    if (!unit) return [];
    text = unit[1]!;
    parsed = parseNumber(text, 'scale');
    if (!parsed) return [];
  }
  if (!parsed.hasPercent) return [parsed.value];
  const dropped = parseNumber(text, 'drop');
  return dropped ? [parsed.value, dropped.value] : [parsed.value];
}

/** Whether a perfect matching exists between a and b under `eq` (Kuhn's algorithm; n ≤ MAX_ELEMENTS). */
function unorderedMatch(a: string[], b: string[], eq: (x: string, y: string) => boolean): boolean {
  const ok = a.map((x) => b.map((y) => eq(x, y)));
  const matchOfB = new Array<number>(b.length).fill(-1);
  const tryAssign = (i: number, seen: boolean[]): boolean => {
    for (let j = 0; j < b.length; j++) {
      if (!ok[i]![j] || seen[j]) continue;
      seen[j] = true;
      if (matchOfB[j] === -1 || tryAssign(matchOfB[j]!, seen)) {
        matchOfB[j] = i;
        return true;
      }
    }
    return false;
  };
  return a.every((_, i) => tryAssign(i, new Array<boolean>(b.length).fill(false)));
}

function compare(a: string, b: string, nesting: number, budget: Budget): EquivalenceResult {
  if (--budget.left < 0) return { equivalent: false, method: 'none' };
  // Inside a tuple "x = 1" keeps its variable: (x=1, y=2) must not match (y=1, x=2).
  const options = { stripAssignment: nesting === 0 };
  const na = normalizeAnswer(a, options);
  const nb = normalizeAnswer(b, options);
  const va = numericReadings(na);
  const vb = numericReadings(nb);
  if (va.length > 0 && vb.length > 0) {
    for (const x of va) {
      for (const y of vb) {
        if (numbersEqual(x, y)) return { equivalent: true, method: x.exact && y.exact ? 'rational' : 'tolerance' };
      }
    }
    return { equivalent: false, method: va[0]!.exact && vb[0]!.exact ? 'rational' : 'tolerance' };
  }
  if (canonicalText(na) === canonicalText(nb)) return { equivalent: true, method: 'text' };
  if (nesting < MAX_NESTING && va.length === 0 && vb.length === 0) {
    const eq = (x: string, y: string): boolean => compare(x, y, nesting + 1, budget).equivalent;
    const ba = bracketed(na);
    const bb = bracketed(nb);
    if (ba && bb && ba.open === bb.open && ba.close === bb.close && ba.parts.length === bb.parts.length) {
      if (ba.parts.length > MAX_ELEMENTS) return { equivalent: false, method: 'text' };
      const same = ba.open === '\\{' ? unorderedMatch(ba.parts, bb.parts, eq) : ba.parts.every((p, i) => eq(p, bb.parts[i]!));
      return { equivalent: same, method: 'elements' };
    }
    if (!ba && !bb) {
      const la = splitTopLevel(na);
      const lb = splitTopLevel(nb);
      if (la.length > 1 && la.length === lb.length && la.length <= MAX_ELEMENTS) {
        return { equivalent: unorderedMatch(la, lb, eq), method: 'elements' };
      }
    }
  }
  return { equivalent: false, method: 'text' };
}

/**
 * Compares a predicted answer with the reference and says which rule decided. Total: returns
 * {equivalent: false, method: 'none'} for empty input and never throws.
 */
export function checkEquivalence(predicted: string | number, reference: string | number): EquivalenceResult {
  try {
    const a = String(predicted).trim();
    const b = String(reference).trim();
    if (a === '' || b === '') return { equivalent: false, method: 'none' };
    if (a.length > MAX_ANSWER_LENGTH || b.length > MAX_ANSWER_LENGTH) return { equivalent: a === b, method: 'text' };
    return compare(a, b, 0, { left: MAX_COMPARISONS });
  } catch {
    return { equivalent: false, method: 'none' };
  }
}

/** Whether `predicted` and `reference` are the same answer under the rules above. Symmetric; never throws. */
export function answersEquivalent(predicted: string | number, reference: string | number): boolean {
  return checkEquivalence(predicted, reference).equivalent;
}
