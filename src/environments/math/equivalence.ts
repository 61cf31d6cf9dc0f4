import { evaluateExpression, parseNumber, MAX_EXPRESSION_LENGTH, type ParsedNumber } from './expression.js';
import { canonicalText, matchingClose, normalizeAnswer } from './normalize.js';
import { numbersEqual, rational, roundedEqual, type Num } from './rational.js';

/**
 * Deciding whether a model's final answer matches the reference: the built-in checker of the math environment
 * (the other one runs math-verify itself, see math-verify-checker.ts). It follows math-verify's documented
 * behaviour wherever a rule can be stated without a CAS, so that switching checkers changes few rewards (the
 * agreement on a corpus is measured by test/environments/math/agreement.test.ts). It must be right in both
 * directions (a false "wrong" teaches the model to avoid correct forms, a false "right" rewards guessing),
 * symmetric, and total: it never throws and never hangs on adversarial text.
 *
 * Rules, in order (each side normalised first, see {@link normalizeAnswer}):
 * 1. Relations. "x = 5" against "5": the right side of the last = is the answer (as math-verify does); two
 *    relations match when they have the same (or mirrored: x > 3, 3 < x) relation and lhs − rhs agree as
 *    expressions, so "x = 1" ≠ "y = 1".
 * 2. Numbers. Both sides evaluate without variables (integers, "1,000", decimals, 1e3, \frac, \sqrt, ^, \cdot,
 *    \times, functions, mixed numbers, \pi, e) → when either side is written with a decimal point, both are
 *    rounded to 6 places (math-verify's float_rounding: 0.333333 = 1/3, but 0.333 ≠ 1/3, 3.14 ≠ π), except
 *    against an integer, which a decimal must equal (2.0 = 2, 5.0000001 ≠ 5, as in math-verify); otherwise exactly
 *    (rationals) or to 1e-10 (irrationals). A trailing unit word ("5 cm") is ignored, but a one-letter word that is no
 *    unit symbol is a variable ("5 x" ≠ 5); "or"/"and" join a list, never a unit ("5 or x" ≠ 5: math-verify reads the
 *    set {5, x}, and so does rule 6).
 * 3. Percent. "50%" is 1/2 (so 50% = 0.5 = \frac12); an integer percent also equals the bare integer (9% = 9), as
 *    in math-verify, but 12.5% ≠ 12.5.
 * 4. Expressions with variables ("(x+1)^2" vs "x^2+2x+1", "\sin^2 x + \cos^2 x" vs "1"): the same variables, and
 *    equal values at eight fixed rational points (exact arithmetic where the expression is rational, floats with
 *    error bounds elsewhere), with at least three points where both are defined and none where either leaves the
 *    range of doubles (then the texts decide: 1 + x^{3000} ≠ 1).
 *    A polynomial identity that holds at eight generic points is an identity unless its degree exceeds seven; the
 *    rest is math-verify's simplify() territory.
 * 5. Text. The canonical texts match: whitespace removed, lower-cased, \left/\right, \!, \, removed, outer braces
 *    dropped: "\text{Yes}" = "yes", "(B)" = "B".
 * 6. Tuples, intervals, sets, matrices: same brackets and the same number of top-level parts → element-wise, in
 *    order; \{…\} sets and bare lists "1, 2" (or "x = 1 or x = 2") ignore order; unions (\cup) of finite sets are merged. As in
 *    math-verify, an open pair "(1, 2)" also equals the list "1, 2" and a tuple equals a set written in the same
 *    order. Intervals keep their ends: [1, 2) ≠ (1, 2).
 *
 * Inputs longer than {@link MAX_ANSWER_LENGTH} characters are equal only when identical after trimming, and
 * nested lists stop being compared after a fixed number of element comparisons (then: not equivalent).
 */
export const MAX_ANSWER_LENGTH = MAX_EXPRESSION_LENGTH;

/** Which rule decided: useful in the evaluation report to see why an answer was (not) accepted. */
export type EquivalenceMethod = 'rational' | 'rounded' | 'tolerance' | 'symbolic' | 'relation' | 'elements' | 'text' | 'none';

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

/** Splits at `separator` where it is not inside (), [], {} — escaped \{ \} count as brackets here. */
function splitTopLevel(s: string, separator = ','): string[] {
  const parts: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    let c = s[i]!;
    if (depth === 0 && s.startsWith(separator, i) && (separator === ',' || !/[a-zA-Z]/.test(s[i + separator.length] ?? ''))) {
      parts.push(s.slice(start, i));
      start = i + separator.length;
      i += separator.length - 1;
      continue;
    }
    if (c === '\\' && (s[i + 1] === '{' || s[i + 1] === '}')) c = s[++i]!;
    else if (c === '\\') continue;
    if (c === '(' || c === '[' || c === '{') depth++;
    else if (c === ')' || c === ']' || c === '}') depth--;
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

interface Relation {
  lhs: string;
  op: '=' | '<' | '>' | '<=' | '>=' | '!=';
  rhs: string;
}

const RELATION_TOKENS: ReadonlyArray<readonly [string, Relation['op']]> = [
  ['\\leqslant', '<='],
  ['\\geqslant', '>='],
  ['\\leq', '<='],
  ['\\geq', '>='],
  ['\\neq', '!='],
  ['\\le', '<='],
  ['\\ge', '>='],
  ['\\ne', '!='],
  ['\\lt', '<'],
  ['\\gt', '>'],
  ['<=', '<='],
  ['>=', '>='],
  ['=', '='],
  ['<', '<'],
  ['>', '>'],
];
/** A word joining two statements ("x = 2 or x = 3"): what lies between two relation signs of one chain never holds one. */
const ALTERNATIVES = /(?:^|[^a-zA-Z\\])(?:or|and)(?![a-zA-Z])|\\(?:lor|land|vee|wedge|text\s*\{\s*(?:or|and)\s*\})(?![a-zA-Z])|;/;
const MIRRORED: Readonly<Record<Relation['op'], Relation['op']>> = { '=': '=', '!=': '!=', '<': '>', '>': '<', '<=': '>=', '>=': '<=' };

/**
 * The relation a normalised answer states, split at its top-level relation symbols: "y = 2x + 1" → y, =, 2x+1.
 * A chain "a = b = c" keeps its first left side and last right side (math-verify's reading); a chain of
 * inequalities ("1 < x < 2") is not one relation (undefined: compared as text).
 */
function relationOf(s: string): Relation | undefined {
  const found: Array<{ at: number; length: number; op: Relation['op'] }> = [];
  let depth = 0;
  let commaAfterRelation = false;
  for (let i = 0; i < s.length; i++) {
    if (depth === 0) {
      if (s[i] === ',' && found.length > 0) commaAfterRelation = true;
      const token = RELATION_TOKENS.find(([t]) => s.startsWith(t, i) && !(t.startsWith('\\') && /[a-zA-Z]/.test(s[i + t.length] ?? '')));
      if (token) {
        // "x = 2, x = 3" and "x = 2 or x = 3" are two relations, not the chain x = 3 whose last side would be the answer.
        const last = found.at(-1);
        if (last && (commaAfterRelation || ALTERNATIVES.test(s.slice(last.at + last.length, i)))) return undefined;
        found.push({ at: i, length: token[0].length, op: token[1] });
        i += token[0].length - 1;
        continue;
      }
    }
    let c = s[i]!;
    if (c === '\\') {
      c = s[++i] ?? '';
      if (c !== '{' && c !== '}') continue;
    }
    if (c === '(' || c === '[' || c === '{') depth++;
    else if (c === ')' || c === ']' || c === '}') depth--;
  }
  if (found.length === 0) return undefined;
  if (found.length > 1 && !found.every((f) => f.op === '=')) return undefined;
  const first = found[0]!;
  const last = found.at(-1)!;
  const lhs = s.slice(0, first.at).trim();
  const rhs = s.slice(last.at + last.length).trim();
  if (lhs === '' || rhs === '') return undefined;
  return { lhs, op: first.op, rhs };
}

interface Reading extends ParsedNumber {
  /** The value of an integer percent with the sign dropped (9% → 9), if it is one. */
  dropped?: Num;
}

const UNIT_SUFFIX = /^(.*?\S)\s+[a-zA-Z]{1,20}(?: [a-zA-Z]{1,20}){0,3}$/;
/** Words that join alternatives ("5 or x", "5 and more"): the number is one of several answers, not a measure. */
const NOT_A_UNIT = /(?:^|\s)(?:or|and)(?:\s|$)/i;

/**
 * One-letter words that are units after a number (math-verify's one-letter units c d g h l m o s t, and the SI symbols
 * J N W V K L A T): any other letter is a variable ("\frac34 x" is 3x/4, and against "\frac34 y" it is another answer,
 * as math-verify reads them).
 */
const ONE_LETTER_UNITS = /^[cdghlmostJNWVKLAT]$/;

/** "5 cm" → "5" when what is left is a number; anything else unchanged. */
function stripUnit(s: string): string {
  const unit = UNIT_SUFFIX.exec(s.length <= 200 ? s : '');
  if (!unit) return s;
  const words = s.slice(unit[1]!.length);
  if (NOT_A_UNIT.test(words) || words.trim().split(' ').some((w) => w.length === 1 && !ONE_LETTER_UNITS.test(w))) return s;
  return parseNumber(unit[1]!) ? unit[1]! : s;
}

/** The number a normalised answer is, if it is one without variables (a trailing unit word dropped). */
function numericReading(s: string): Reading | undefined {
  let text = s;
  let parsed = parseNumber(text, 'scale');
  if (!parsed) {
    text = stripUnit(s);
    parsed = text === s ? undefined : parseNumber(text, 'scale');
    if (!parsed) return undefined;
  }
  if (!parsed.hasPercent || !parsed.integerLiteral) return parsed;
  const dropped = parseNumber(text, 'drop');
  return dropped ? { ...parsed, dropped: dropped.value } : parsed;
}

function numbersMatch(x: Reading, y: Reading): { equivalent: boolean; method: EquivalenceMethod } {
  const method: EquivalenceMethod = x.hasDecimal || y.hasDecimal ? 'rounded' : x.value.exact && y.value.exact ? 'rational' : 'tolerance';
  // A decimal against an integer must equal it (5.0 = 5, 5.0000001 ≠ 5): math-verify's sympy compares the rounded
  // Float with the Integer exactly; rounding applies against a fraction or an irrational (0.333333 = 1/3) only.
  const integer = (r: Reading): boolean => !r.hasDecimal && r.value.exact && r.value.d === 1n;
  const rounded = method === 'rounded' && !integer(x) && !integer(y);
  const same = (a: Num, b: Num): boolean => (rounded ? roundedEqual(a, b) : numbersEqual(a, b));
  if (same(x.value, y.value)) return { equivalent: true, method };
  // 9% = 9: math-verify compares two integers' values with the percent dropped; 12.5% ≠ 12.5.
  if (x.dropped && y.integerLiteral && !y.hasPercent && numbersEqual(x.dropped, y.value)) return { equivalent: true, method: 'rational' };
  if (y.dropped && x.integerLiteral && !x.hasPercent && numbersEqual(y.dropped, x.value)) return { equivalent: true, method: 'rational' };
  return { equivalent: false, method };
}

/** Rational points at which expressions with variables are compared: generic (no small integers, no symmetry). */
const POINTS: readonly Num[] = [
  rational(3n, 7n),
  rational(5n, 3n),
  rational(-2n, 5n),
  rational(7n, 2n),
  rational(11n, 13n),
  rational(-13n, 6n),
  rational(17n, 5n),
  rational(2n, 9n),
];
const MIN_DEFINED_POINTS = 3;
const SYMBOLIC_TOLERANCE = 1e-9;

/**
 * Whether two expressions with variables are the same function: undefined when either is not an expression (or
 * neither has a variable), false when a point tells them apart, true when at least {@link MIN_DEFINED_POINTS} points
 * where both are defined agree and none disagrees. Variables need not be the same: \sin^2 x + \cos^2 x = 1, and
 * x + 1 ≠ y + 1 because the points give x and y different values.
 *
 * A point where either side's value leaves the range of doubles ('lost': x^{3000} overflows at 5/3 and underflows at
 * 3/7) makes the comparison undecided (the texts decide): skipping it as undefined let 1 + x^{3000} equal 1, the
 * points where the power is not negligible being exactly the ones that overflowed. Floats carry error bounds
 * (rational.ts), so a tiny value that is known (e^{-1000x^2} is 2.7e-80 at 3/7) is not 0, and \sin^2 x + \cos^2 x - 1,
 * within its rounding error of 0 at every point, is 0.
 */
function symbolicEqual(a: string, b: string): boolean | undefined {
  const probe = (): Num => POINTS[0]!;
  const ea = evaluateExpression(a, probe);
  const eb = evaluateExpression(b, probe);
  if (ea.kind === 'invalid' || eb.kind === 'invalid') return undefined;
  const names = [...new Set([...ea.variables, ...eb.variables])].sort();
  if (names.length === 0) return undefined;
  let defined = 0;
  for (let i = 0; i < POINTS.length; i++) {
    const assign = (name: string): Num => POINTS[(i + 3 * names.indexOf(name)) % POINTS.length]!;
    const va = evaluateExpression(a, assign);
    const vb = evaluateExpression(b, assign);
    if (va.kind === 'lost' || vb.kind === 'lost') return undefined;
    if (va.kind !== 'value' || vb.kind !== 'value') continue;
    if (!numbersEqual(va.value, vb.value, SYMBOLIC_TOLERANCE)) return false;
    defined++;
  }
  return defined >= MIN_DEFINED_POINTS;
}

/** Two expressions (no relation, no list) compared as numbers, then as functions of their variables, then as text. */
function compareExpressions(na: string, nb: string): EquivalenceResult {
  const ra = numericReading(na);
  const rb = numericReading(nb);
  if (ra && rb) return numbersMatch(ra, rb);
  if (canonicalText(na) === canonicalText(nb)) return { equivalent: true, method: 'text' };
  // Here one side at most is a number, and the other has variables: a trailing word read as a unit may be one of
  // them ("\frac34 x" is 3x/4, not 3/4 of a unit x), so both are compared as written ("5 cm" against "5x" stays
  // unequal: c·m is not x).
  const symbolic = symbolicEqual(na, nb);
  if (symbolic !== undefined) return { equivalent: symbolic, method: 'symbolic' };
  return { equivalent: false, method: 'text' };
}

function compareRelations(a: Relation, b: Relation, nesting: number, budget: Budget): EquivalenceResult {
  const difference = (r: Relation, flip: boolean): string => (flip ? `(${r.rhs})-(${r.lhs})` : `(${r.lhs})-(${r.rhs})`);
  const same = (x: string, y: string): boolean => compare(x, y, nesting + 1, budget).equivalent;
  if (a.op === b.op && same(difference(a, false), difference(b, false))) return { equivalent: true, method: 'relation' };
  if (MIRRORED[a.op] === b.op && same(difference(a, false), difference(b, true))) return { equivalent: true, method: 'relation' };
  if (a.op === b.op && same(a.lhs, b.lhs) && same(a.rhs, b.rhs)) return { equivalent: true, method: 'relation' };
  return { equivalent: false, method: 'relation' };
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

/** "\{1,3\} \cup \{2\}" → the parts of one set; undefined unless every part of the union is a finite set. */
function unionOfFiniteSets(s: string): string[] | undefined {
  const parts = splitTopLevel(s, '\\cup');
  if (parts.length < 2) return undefined;
  const elements: string[] = [];
  for (const part of parts) {
    const b = bracketed(part);
    if (!b || b.open !== '\\{') return undefined;
    elements.push(...b.parts.filter((p) => p !== ''));
  }
  return elements;
}

/** The elements of a set, list or tuple as a collection: kind says how order counts. */
interface Collection {
  kind: 'set' | 'list' | 'tuple' | 'interval' | 'none';
  b?: Bracketed;
  parts: string[];
}

function collection(s: string): Collection {
  const union = unionOfFiniteSets(s);
  if (union) return { kind: 'set', parts: union };
  const b = bracketed(s);
  // "(1+2)" is a parenthesised expression, not a 1-tuple ("[5]" stays a one-entry row of a matrix).
  if (b && !(b.parts.length === 1 && b.open === '(' && b.close === ')')) {
    return { kind: b.open === '\\{' ? 'set' : b.open === '(' && b.close === ')' ? 'tuple' : 'interval', b, parts: b.parts };
  }
  const list = splitTopLevel(s);
  return list.length > 1 ? { kind: 'list', parts: list } : { kind: 'none', parts: [s] };
}

function compareCollections(na: string, nb: string, nesting: number, budget: Budget): EquivalenceResult | undefined {
  const ca = collection(na);
  const cb = collection(nb);
  if (ca.kind === 'none' && cb.kind === 'none') return undefined;
  const eq = (x: string, y: string): boolean => compare(x, y, nesting + 1, budget).equivalent;
  const elements = (equivalent: boolean): EquivalenceResult => ({ equivalent, method: 'elements' });
  // math-verify reads a lone answer against a set as the set of that answer: \{5\} = 5.
  if (ca.kind === 'set' && cb.kind === 'none' && ca.parts.length === 1) return elements(eq(ca.parts[0]!, nb));
  if (cb.kind === 'set' && ca.kind === 'none' && cb.parts.length === 1) return elements(eq(na, cb.parts[0]!));
  if (ca.parts.length !== cb.parts.length || ca.parts.length > MAX_ELEMENTS) return elements(false);
  const unordered = (c: Collection): boolean => c.kind === 'set' || c.kind === 'list';
  const inOrder = (): boolean => ca.parts.every((p, i) => eq(p, cb.parts[i]!));
  if (unordered(ca) && unordered(cb)) return elements(unorderedMatch(ca.parts, cb.parts, eq));
  // math-verify: a tuple against a set or a list is compared in written order; so is an open pair "(1, 2)" (read as
  // an interval) against the list "1, 2".
  if ((ca.kind === 'tuple' && unordered(cb)) || (cb.kind === 'tuple' && unordered(ca))) return elements(inOrder());
  if (ca.b && cb.b && ca.b.open === cb.b.open && ca.b.close === cb.b.close) return elements(inOrder());
  return elements(false);
}

/** "\pm 2" → "-2, 2" and "1 \pm \sqrt2" → "1-\sqrt2, 1+\sqrt2": the two answers it stands for (one \pm only). */
function expandPlusMinus(s: string): string {
  const at = s.indexOf('\\pm');
  if (at < 0 || s.indexOf('\\pm', at + 1) >= 0 || /[a-zA-Z]/.test(s[at + 3] ?? '')) return s;
  const before = s.slice(0, at).trim();
  const after = s.slice(at + 3).trim();
  if (after === '' || splitTopLevel(s).length > 1) return s;
  return `${before}-${after}, ${before}+${after}`;
}

function compare(a: string, b: string, nesting: number, budget: Budget): EquivalenceResult {
  if (--budget.left < 0) return { equivalent: false, method: 'none' };
  const na = expandPlusMinus(normalizeAnswer(a, { stripAssignment: false }));
  const nb = expandPlusMinus(normalizeAnswer(b, { stripAssignment: false }));
  if (na === nb && na !== '') return { equivalent: true, method: 'text' };
  const relA = relationOf(na);
  const relB = relationOf(nb);
  if (relA && relB) return compareRelations(relA, relB, nesting, budget);
  // "x = 5" against "5", "\frac12 + \frac13 = \frac56" against "\frac56": the last right side is the answer.
  if (relA?.op === '=' && !relB) return compare(relA.rhs, nb, nesting, budget);
  if (relB?.op === '=' && !relA) return compare(na, relB.rhs, nesting, budget);
  if (relA || relB) return { equivalent: canonicalText(na) === canonicalText(nb), method: 'text' };
  if (nesting < MAX_NESTING) {
    const collections = compareCollections(na, nb, nesting, budget);
    if (collections) return collections;
  }
  return compareExpressions(na, nb);
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
