/**
 * The pure text operations behind the file editor tool, kept apart so they can be property-tested without a
 * sandbox. Lines are split on '\n' only; a trailing newline does not start an extra line; line numbers are
 * 1-based, as editors and tracebacks show them.
 */

/** Start offsets of every occurrence of `needle` in `text`, overlapping ones included ("aa" occurs twice in "aaa"). */
export function occurrences(text: string, needle: string, max = Infinity): number[] {
  const found: number[] = [];
  if (needle === '') return found;
  for (let at = text.indexOf(needle); at >= 0 && found.length < max; at = text.indexOf(needle, at + 1)) found.push(at);
  return found;
}

/** 1-based line number of a character offset. */
export function lineOf(text: string, offset: number): number {
  let line = 1;
  for (let i = text.indexOf('\n'); i >= 0 && i < offset; i = text.indexOf('\n', i + 1)) line++;
  return line;
}

/** The lines of a text; a final newline ends the last line rather than starting an empty one. */
export function splitLines(text: string): string[] {
  if (text === '') return [];
  const lines = text.split('\n');
  if (text.endsWith('\n')) lines.pop();
  return lines;
}

/** A failed replacement's `count` is exact up to {@link MAX_REPORTED}; past it, `more` is set and `count` is that bound. */
export type ReplaceResult = { ok: true; text: string; line: number } | { ok: false; count: number; more: boolean; lines: number[] };

/** Occurrences counted (and lines shown) when `old_str` is not unique. */
export const MAX_REPORTED = 20;

/**
 * Replaces `oldStr` by `newStr` when it occurs exactly once (counting overlaps, so an ambiguous edit is never
 * applied); otherwise says how often (exactly up to 20, then "more than 20") and on which lines (the first 20) it
 * occurs. `line` is where the edit starts. Counting stops there: counting every overlapping occurrence of a long
 * repetitive `old_str` in a large repetitive file took time quadratic in their sizes (seconds for a 16 MiB file).
 */
export function replaceUnique(text: string, oldStr: string, newStr: string): ReplaceResult {
  const found = occurrences(text, oldStr, MAX_REPORTED + 1);
  if (found.length !== 1) {
    const more = found.length > MAX_REPORTED;
    return { ok: false, count: Math.min(found.length, MAX_REPORTED), more, lines: found.slice(0, MAX_REPORTED).map((at) => lineOf(text, at)) };
  }
  const at = found[0]!;
  return { ok: true, text: text.slice(0, at) + newStr + text.slice(at + oldStr.length), line: lineOf(text, at) };
}

/** Inserts `newText` after line `after` (0: at the top). The caller checks 0 <= after <= line count. */
export function insertAfterLine(text: string, after: number, newText: string): string {
  const lines = splitLines(text);
  const inserted = splitLines(newText.endsWith('\n') || newText === '' ? newText : `${newText}\n`);
  const result = [...lines.slice(0, after), ...inserted, ...lines.slice(after)];
  if (text === '') return inserted.length === 0 ? '' : `${inserted.join('\n')}\n`;
  const trailing = text.endsWith('\n') || (after === lines.length && newText.endsWith('\n')) ? '\n' : '';
  return `${result.join('\n')}${trailing}`;
}

/** Lines `first`..`last` (1-based, inclusive) numbered as `cat -n` does: right-aligned number, a tab, the line. */
export function numberLines(lines: readonly string[], first: number, maxLineChars = 1000): string {
  return lines
    .map((line, i) => {
      const shown = line.length > maxLineChars ? `${line.slice(0, maxLineChars)}… [line cut: ${line.length - maxLineChars} more characters]` : line;
      return `${String(first + i).padStart(6)}\t${shown}`;
    })
    .join('\n');
}
