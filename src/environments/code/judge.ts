/**
 * Output comparison of stdin/stdout tests, as competitive-programming judges do by default (Codeforces' and
 * Kattis's default checkers, CodeContests' and APPS's graders): both outputs are split into tokens at any run of
 * whitespace (spaces, tabs, newlines, CR), and the output is accepted when the token sequences are equal. So
 * trailing spaces, a missing final newline, CRLF line ends and blank lines never matter, while a different
 * number, word or letter case does. Numbers are compared as text ("1.0" is not "1") unless the task gives a
 * {@link FloatTolerance}, as problems whose statement says "answers within an absolute or relative error of 1e-6
 * are accepted" do.
 */

/**
 * Numeric tolerance of a task, off unless given: a token of the expected output that is a decimal number accepts a
 * number within `absolute` of it or within `relative` of its magnitude (either suffices, as on Kattis —
 * `float_absolute_tolerance`, `float_relative_tolerance` — and Codeforces, whose "absolute or relative error at most
 * ε" is both set to ε). The output's token must then be a decimal number too (`nan`, `inf` or hex never are);
 * tokens that are not numbers are still compared as text.
 */
export interface FloatTolerance {
  absolute?: number;
  relative?: number;
}

/** The verdict of one comparison, with the first difference for the report. */
export interface Judgement {
  accepted: boolean;
  /** For a rejection: where it differs, e.g. `token 3: expected "7", got "8"`. */
  difference?: string;
}

const WHITESPACE = /\s+/;
/**
 * A decimal number as judges print them: sign, digits with an optional point, an optional exponent. Written so no
 * two quantifiers can share a digit (`\d+\.?\d*` could, and backtracked quadratically on a long run of digits
 * followed by anything else: 4.5 s for 64K characters of a program's output).
 */
const DECIMAL = /^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$/;

function tokens(text: string): string[] {
  const trimmed = text.trim();
  return trimmed === '' ? [] : trimmed.split(WHITESPACE);
}

/** Whether `got` matches `want`: equal text, or both decimal numbers within the tolerance. */
function tokenMatches(got: string, want: string, tolerance: FloatTolerance | undefined): boolean {
  if (got === want) return true;
  if (!tolerance || !DECIMAL.test(want) || !DECIMAL.test(got)) return false;
  const [a, b] = [Number(got), Number(want)];
  if (!Number.isFinite(a) || !Number.isFinite(b)) return false;
  const error = Math.abs(a - b);
  return (tolerance.absolute !== undefined && error <= tolerance.absolute) || (tolerance.relative !== undefined && error <= tolerance.relative * Math.abs(b));
}

/** Compares a program's stdout with the expected output token by token (see the module's note). */
export function judgeOutput(actual: string, expected: string, tolerance?: FloatTolerance): Judgement {
  const got = tokens(actual);
  const want = tokens(expected);
  const n = Math.min(got.length, want.length);
  for (let i = 0; i < n; i++) {
    if (!tokenMatches(got[i]!, want[i]!, tolerance)) {
      const outside = tolerance && DECIMAL.test(want[i]!) ? ` (${DECIMAL.test(got[i]!) ? 'outside the tolerance' : 'not a number'})` : '';
      return { accepted: false, difference: `token ${i + 1}: expected ${quote(want[i]!)}, got ${quote(got[i]!)}${outside}` };
    }
  }
  if (got.length === want.length) return { accepted: true };
  return got.length < want.length
    ? { accepted: false, difference: `output ends after ${got.length} tokens; expected ${want.length} (next: ${quote(want[n]!)})` }
    : { accepted: false, difference: `output has ${got.length} tokens; expected ${want.length} (extra: ${quote(got[n]!)})` };
}

function quote(token: string): string {
  return JSON.stringify(token.length > 40 ? `${token.slice(0, 40)}…` : token);
}
