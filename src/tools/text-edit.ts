/**
 * The pure text operations behind the file editor tool, kept apart so they can be property-tested without a
 * sandbox. Lines are split on '\n' only; a trailing newline does not start an extra line; line numbers are
 * 1-based, as editors and tracebacks show them. They run on the server's event loop over files of up to 16 MiB that
 * the model wrote (16 million lines): each is one pass over the text at most, and none builds an array of its lines.
 */

/** Start offsets of every occurrence of `needle` in `text`, overlapping ones included ("aa" occurs twice in "aaa"). */
export function occurrences(text: string, needle: string, max = Infinity): number[] {
  const found: number[] = [];
  if (needle === '') return found;
  for (let at = text.indexOf(needle); at >= 0 && found.length < max; at = text.indexOf(needle, at + 1)) found.push(at);
  return found;
}

/** 1-based line numbers of character offsets given in ascending order, in one pass. */
export function linesOf(text: string, offsets: readonly number[]): number[] {
  const lines: number[] = [];
  let line = 1;
  let i = 0;
  for (const offset of offsets) {
    for (; i < offset; i++) if (text.charCodeAt(i) === NEWLINE) line++;
    lines.push(line);
  }
  return lines;
}

/** How many lines splitLines would give, without building them. */
export function countLines(text: string): number {
  if (text === '') return 0;
  let newlines = 0;
  for (let i = 0; i < text.length; i++) if (text.charCodeAt(i) === NEWLINE) newlines++;
  return text.charCodeAt(text.length - 1) === NEWLINE ? newlines : newlines + 1;
}

/** Where 1-based line `line` starts; `text.length` when the text has fewer lines. */
export function lineStart(text: string, line: number): number {
  if (line <= 1) return 0;
  let n = 1;
  for (let i = 0; i < text.length; i++) if (text.charCodeAt(i) === NEWLINE && ++n === line) return i + 1;
  return text.length;
}

/** Lines `first`..`last` (1-based, inclusive; fewer past the end): `splitLines(text).slice(first - 1, last)`. */
export function linesBetween(text: string, first: number, last: number): string[] {
  const lines: string[] = [];
  let at = lineStart(text, first);
  for (let n = Math.max(first, 1); n <= last && at < text.length; n++) {
    const newline = text.indexOf('\n', at);
    const end = newline < 0 ? text.length : newline;
    lines.push(text.slice(at, end));
    at = end + 1;
  }
  return lines;
}

const NEWLINE = 10;

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
    return { ok: false, count: Math.min(found.length, MAX_REPORTED), more, lines: linesOf(text, found.slice(0, MAX_REPORTED)) };
  }
  const at = found[0]!;
  return { ok: true, text: text.slice(0, at) + newStr + text.slice(at + oldStr.length), line: linesOf(text, [at])[0]! };
}

/**
 * Inserts `newText` after line `after` (0: at the top), as whole lines: it ends with a newline in the result. The
 * caller checks 0 <= after <= line count. After the last line, the text's own final newline (or its absence) stays
 * at the end unless `newText` brings one.
 */
export function insertAfterLine(text: string, after: number, newText: string): string {
  const block = newText === '' || newText.endsWith('\n') ? newText : `${newText}\n`;
  if (text === '' || block === '') return text === '' ? block : text;
  const at = lineStart(text, after + 1);
  if (at < text.length) return text.slice(0, at) + block + text.slice(at);
  const ended = text.endsWith('\n');
  return `${ended ? text.slice(0, -1) : text}\n${block.slice(0, -1)}${ended || newText.endsWith('\n') ? '\n' : ''}`;
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
