import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { countLines, insertAfterLine, linesBetween, linesOf, occurrences, replaceUnique, splitLines } from '../../src/tools/text-edit.js';

const text = fc.string({ unit: fc.constantFrom('a', 'b', '\n', ' ', 'é'), maxLength: 60 });

describe('text edits', () => {
  it('property: a unique replacement is undone by replacing back, and applies nowhere else', () => {
    fc.assert(
      fc.property(text, text, fc.string({ unit: fc.constantFrom('X', 'Y', '\n'), minLength: 1, maxLength: 5 }), (before, after, marker) => {
        const original = `${before}${marker}${after}`;
        fc.pre(occurrences(original, marker).length === 1);
        const r = replaceUnique(original, marker, 'ZZ');
        expect(r.ok).toBe(true);
        if (!r.ok) return;
        expect(r.text).toBe(`${before}ZZ${after}`);
        expect(r.line).toBe(splitLines(`${before}.`).length);
        const back = replaceUnique(r.text, 'ZZ', marker);
        if (back.ok) expect(back.text).toBe(original);
      }),
    );
  });

  it('property: zero or several occurrences change nothing and report the count and lines', () => {
    fc.assert(
      fc.property(text, fc.string({ unit: fc.constantFrom('a', 'b', '\n'), minLength: 1, maxLength: 3 }), (content, needle) => {
        const count = occurrences(content, needle).length;
        fc.pre(count !== 1);
        const r = replaceUnique(content, needle, 'new');
        expect(r).toMatchObject({ ok: false, count });
        if (!r.ok) expect(r.lines.length).toBe(Math.min(count, 20));
      }),
    );
  });

  it('property: inserting after line n puts the new lines at n+1.. and keeps every other line', () => {
    fc.assert(
      fc.property(text, fc.string({ unit: fc.constantFrom('x', 'y', '\n'), minLength: 1, maxLength: 10 }), fc.nat(), (content, inserted, k) => {
        const lines = splitLines(content);
        const n = k % (lines.length + 1);
        const result = splitLines(insertAfterLine(content, n, inserted));
        expect(result).toEqual([...lines.slice(0, n), ...splitLines(inserted.endsWith('\n') ? inserted : `${inserted}\n`), ...lines.slice(n)]);
      }),
    );
  });

  it('property: line counts, line ranges and line numbers of offsets agree with splitting the text', () => {
    fc.assert(
      fc.property(text, fc.integer({ min: -2, max: 30 }), fc.integer({ min: -2, max: 30 }), fc.array(fc.nat(), { maxLength: 5 }), (content, first, last, picks) => {
        const lines = splitLines(content);
        expect(countLines(content)).toBe(lines.length);
        if (first >= 1) expect(linesBetween(content, first, last)).toEqual(lines.slice(first - 1, Math.max(first - 1, last)));
        const offsets = picks.map((p) => p % (content.length + 1)).sort((a, b) => a - b);
        expect(linesOf(content, offsets)).toEqual(offsets.map((at) => content.slice(0, at).split('\n').length));
      }),
    );
  });

  it('counts overlapping occurrences, so an ambiguous edit is refused', () => {
    expect(replaceUnique('aaa', 'aa', 'b')).toEqual({ ok: false, count: 2, more: false, lines: [1, 1] });
  });

  it('counts up to 20 and then says "more", in time linear in the file (a repetitive file and old_str were quadratic)', () => {
    const text = `${'a'.repeat(1 << 20)}\n`;
    const started = performance.now();
    const r = replaceUnique(text, 'a'.repeat(1 << 18), 'b');
    expect(performance.now() - started).toBeLessThan(500);
    expect(r).toEqual({ ok: false, count: 20, more: true, lines: Array.from({ length: 20 }, () => 1) });
    expect(replaceUnique('x\nx\nx', 'x', 'y')).toEqual({ ok: false, count: 3, more: false, lines: [1, 2, 3] });
  });
});
