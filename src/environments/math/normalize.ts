import { unwrapBoxed } from './extract.js';

/**
 * Text clean-up applied to both sides of an answer comparison before anything else. Each rule removes a way of
 * writing the same answer differently that models and datasets actually use; none of them changes a value.
 * All rules are linear-time string passes (no backtracking-prone regexes), run on capped input.
 */

const UNICODE: ReadonlyArray<readonly [string, string]> = [
  ['\u2212', '-'], // minus sign
  ['\u2013', '-'], // en dash, as a minus
  ['\u00d7', '\\times '],
  ['\u00f7', '\\div '],
  ['\u22c5', '\\cdot '],
  ['\u00b7', '\\cdot '],
  ['\u221a', '\\sqrt'],
  ['\u03c0', '\\pi '],
  ['\u221e', '\\infty '],
  ['\u00b0', ''],
  ['\uff0c', ','],
  ['\u2264', '\\le '],
  ['\u2265', '\\ge '],
  ['\u2260', '\\ne '],
];

/** LaTeX spacing and sizing that never carries meaning in an answer. */
const NOISE = /\\(?:left|right)\.|\\(?:left|right|bigg|Bigg|big|Big|displaystyle|qquad|quad)(?![a-zA-Z])|\\[!,;:> ]|~/g;

/** Text-like wrappers: \text{cm} ending a numeric answer is a unit; \text{yes} alone is the answer. */
const TEXT_GROUP = /\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|mathit|textnormal)\s*\{([^{}]*)\}/g;
const TEXT_UNIT_SUFFIX = /\\(?:text|textrm|mathrm|mbox|textnormal)\s*\{[^{}]*\}(?:\s*\^\s*(?:\{\s*\d\s*\}|\d))?\s*$/;

/** "x = 5", "x_1 = 5", "\theta = 5" → "5": the left side is a bare variable. */
const ASSIGNMENT = /^\s*(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?[a-zA-Z0-9]{1,4}\}?)?\s*=([^=]*)$/;

/** "x \in [1, 2]", "x \in \{1, 2\}" → the set: a variable's membership states its set, as math-verify reads it. */
const MEMBERSHIP = /^\s*(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?[a-zA-Z0-9]{1,4}\}?)?\s*\\in(?![a-zA-Z])\s*(?=\S)/;

/**
 * "x = 2 or x = 3", "2 \text{ and } 3": a word joining answers is a list separator, as math-verify reads it (the set
 * {2, 3}), so a list of solutions written so equals "2, 3", and never one of its members ("5 or x" ≠ 5).
 */
const JOINING_WORD = /\\(?:text|textrm|mathrm|mbox|textnormal)\s*\{\s*(?:or|and)\s*\}|\s+(?:or|and)\s+/gi;

/** "= 5", "\approx 3.14": a relation left over from "x \approx 3.14" once the model boxed only its right side. */
const LEADING_RELATION = /^(?:=|\\approx|\u2248)\s*/;

/** 1,000 or 12,345.67 or 1 000 — whole string only, so "1, 234" stays a list. */
const THOUSANDS = /^[+-]?\d{1,3}(?:(?:,\d{3})+|(?: \d{3})+)(?:\.\d+)?$/;

/** "28 percent", "28 pct": the word is the sign (math-verify reads them as 28%). */
const PERCENT_WORD = /^([^%]{0,200}\d)\s*(?:percent(?:age)?|pct)$/i;

/** A matrix environment: rows split at \\, entries at &. */
const MATRIX = /^\\begin\{([pbvBV]?matrix|array)\}(?:\{[lcr|]*\})?([^]*?)\\end\{\1\}$/;

/**
 * \begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix} → [[1,2],[3,4]]: rows and entries compared in order, as math-verify
 * compares matrices of the same shape.
 */
function matrixAsLists(s: string): string {
  const m = MATRIX.exec(s);
  if (!m) return s;
  const rows = m[2]!
    .split('\\\\')
    .map((row) => row.trim())
    .filter((row) => row !== '');
  return `[${rows.map((row) => `[${row.split('&').map((x) => x.trim()).join(',')}]`).join(',')}]`;
}

function stripDelimiters(s: string): string {
  for (let i = 0; i < 8; i++) {
    const before = s;
    s = stripTrailingPunctuation(s.trim()).replace(LEADING_RELATION, '');
    if (s.startsWith('$$') && s.endsWith('$$') && s.length >= 4) s = s.slice(2, -2);
    else if (s.startsWith('$') && s.endsWith('$') && s.length >= 2) s = s.slice(1, -1);
    else if (s.startsWith('$') && !s.includes('$', 1)) s = s.slice(1); // a currency sign: $5
    else if ((s.startsWith('\\(') && s.endsWith('\\)')) || (s.startsWith('\\[') && s.endsWith('\\]'))) s = s.slice(2, -2);
    s = unwrapBoxed(s);
    if (s === before) break;
  }
  return s.trim();
}

function stripTrailingPunctuation(s: string): string {
  let end = s.length;
  while (end > 0 && /[.\s。]/.test(s[end - 1]!)) end--;
  return s.slice(0, end);
}

function handleText(s: string): string {
  if (!s.includes('\\')) return s;
  const withoutUnits = s.replace(TEXT_UNIT_SUFFIX, '').trim();
  if (withoutUnits !== '' && /\d/.test(withoutUnits)) return withoutUnits;
  return s.replace(TEXT_GROUP, '$1');
}

/**
 * Normalises one answer: strips $…$, \(…\), \[…\], \boxed{…}; maps Unicode math symbols to LaTeX; removes
 * \left/\right, \!, \, and friends; \dfrac/\tfrac → \frac; \% → %; drops degree signs, \$ and units in \text{}
 * ending a numeric answer; drops a trailing period and a leading "=" or \approx; "x = 5" → "5" (unless `stripAssignment` is false);
 * "x \in S" → "S"; "or" / "and" between answers → ","; "1,000" → "1000".
 */
export function normalizeAnswer(raw: string, options: { stripAssignment?: boolean } = {}): string {
  let s = raw;
  for (const [from, to] of UNICODE) if (s.includes(from)) s = s.split(from).join(to);
  s = stripDelimiters(s);
  s = matrixAsLists(s); // before NOISE, which would eat the "\\ " of a row break
  s = s.replace(NOISE, '');
  s = s.replace(/\\[dtc]frac/g, '\\frac').replace(/\\[dt]binom/g, '\\binom');
  s = s.replace(/\\%/g, '%').replace(/\\\$/g, '').replace(/\{,\}/g, ',');
  s = s.replace(/\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree/g, '');
  s = handleText(s);
  s = s.replace(JOINING_WORD, ', ');
  s = stripDelimiters(s);
  s = s.replace(MEMBERSHIP, '');
  const assignment = options.stripAssignment === false ? null : ASSIGNMENT.exec(s);
  if (assignment) s = assignment[1]!.trim();
  if (THOUSANDS.test(s)) s = s.replace(/[, ]/g, '');
  s = s.replace(PERCENT_WORD, '$1%');
  return s.trim();
}

/**
 * The form used when answers are compared as text: normalised, then whitespace removed, lower-cased,
 * braces around one-character exponents and subscripts (x^{2} → x^2) and redundant outer braces dropped,
 * \frac12 spelled \frac{1}{2}, a parenthesised choice letter "(B)" read as "B".
 * "\{a, b\}" and "\{a,b\}" meet here; "x+1" and "1+x" do not (no algebra).
 */
export function canonicalText(normalized: string): string {
  let s = normalized
    .replace(/\s+/g, '')
    .replace(/([\^_])\{([a-zA-Z0-9])\}/g, '$1$2')
    .replace(/\\frac([a-zA-Z0-9])([a-zA-Z0-9])/g, '\\frac{$1}{$2}')
    .toLowerCase();
  while (s.startsWith('{') && s.endsWith('}') && matchingClose(s, 0) === s.length - 1) s = s.slice(1, -1);
  // A multiple-choice letter: "(B)" and "B" are the same choice.
  return /^\([a-z]\)$/.test(s) ? s.slice(1, 2) : s;
}

/** Index of the bracket closing the one at `open`, honouring nesting and backslash escapes; -1 if none. */
export function matchingClose(s: string, open: number): number {
  const opener = s[open];
  const closer = opener === '{' ? '}' : opener === '(' ? ')' : opener === '[' ? ']' : '';
  if (!closer) return -1;
  let depth = 0;
  for (let i = open; i < s.length; i++) {
    const c = s[i];
    if (c === '\\') {
      i++;
      continue;
    }
    if (c === opener) depth++;
    else if (c === closer && --depth === 0) return i;
  }
  return -1;
}
