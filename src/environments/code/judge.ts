/**
 * Output comparison of stdin/stdout tests, as competitive-programming judges do by default (Codeforces' and
 * Kattis's default checkers, CodeContests' and APPS's graders): both outputs are split into tokens at any run of
 * whitespace (spaces, tabs, newlines, CR), and the output is accepted when the token sequences are equal. So
 * trailing spaces, a missing final newline, CRLF line ends and blank lines never matter, while a different
 * number, word or letter case does. Numbers are compared as text ("1.0" is not "1"): a task that accepts
 * approximate floats needs its expected output rounded as the statement asks.
 */

/** The verdict of one comparison, with the first difference for the report. */
export interface Judgement {
  accepted: boolean;
  /** For a rejection: where it differs, e.g. `token 3: expected "7", got "8"`. */
  difference?: string;
}

const WHITESPACE = /\s+/;

function tokens(text: string): string[] {
  const trimmed = text.trim();
  return trimmed === '' ? [] : trimmed.split(WHITESPACE);
}

/** Compares a program's stdout with the expected output token by token (see the module's note). */
export function judgeOutput(actual: string, expected: string): Judgement {
  const got = tokens(actual);
  const want = tokens(expected);
  const n = Math.min(got.length, want.length);
  for (let i = 0; i < n; i++) {
    if (got[i] !== want[i]) return { accepted: false, difference: `token ${i + 1}: expected ${quote(want[i]!)}, got ${quote(got[i]!)}` };
  }
  if (got.length === want.length) return { accepted: true };
  return got.length < want.length
    ? { accepted: false, difference: `output ends after ${got.length} tokens; expected ${want.length} (next: ${quote(want[n]!)})` }
    : { accepted: false, difference: `output has ${got.length} tokens; expected ${want.length} (extra: ${quote(got[n]!)})` };
}

function quote(token: string): string {
  return JSON.stringify(token.length > 40 ? `${token.slice(0, 40)}…` : token);
}
