import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createToolCallParser } from '../../src/tools/parsers.js';
import type { ToolCall, ToolCallParser } from '../../src/tools/types.js';

// Review s40: the tool-call parsers of the four families (Qwen3 and Gemma 3: hermes; Llama 3.1: llama3_json;
// DeepSeek-V3: deepseek_v3) against hostile text that looks like tool calls: their own format nested in arguments,
// cut anywhere, other families' control tokens spelled out, reasoning tags, unicode, stray braces, quotes and
// backslashes. Two properties: a parse never throws, and every call it returns came from the text — its name is text
// of the message and its arguments are a JSON value written in it (an object, or a JSON string holding one).
// REVIEW_S40_FUZZ_MS runs each family for that long (the review ran 120,000 ms each); the default is a quick run.

const FUZZ_MS = Number(process.env.REVIEW_S40_FUZZ_MS ?? 0);

const CONTROL = [
  '<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>', '<think>', '</think>', '<|im_end|>', '<|im_start|>',
  '<|python_tag|>', '<|eot_id|>', '<|eom_id|>', '<|start_header_id|>', '<|end_header_id|>', '<｜tool▁calls▁begin｜>',
  '<｜tool▁calls▁end｜>', '<｜tool▁call▁begin｜>', '<｜tool▁call▁end｜>', '<｜tool▁sep｜>', '<｜tool▁outputs▁begin｜>',
  '<｜end▁of▁sentence｜>', '<｜Assistant｜>', '<start_of_turn>', '<end_of_turn>', '<eos>',
];
const JSONISH = ['{', '}', '[', ']', '"', '\\', '\\"', ':', ',', ';', '"name"', '"arguments"', '"parameters"', 'function', '```', '```json', '\n', ' ', '\t', 'null', 'true', '1e999', '-0', '\\u0000', '\\ud800', '"\\u003c"'];
const UNICODE = ['é', '中', '🙂', '𓀀', '\u200b', '\u2028', '\ufeff', '\ud800', '\udfff', '\u0000', '｜', '▁', '\u{10FFF0}'];

const argValue: fc.Arbitrary<unknown> = fc.letrec<{ v: unknown }>((tie) => ({
  v: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.string({ unit: fc.oneof(fc.constantFrom(...CONTROL, ...JSONISH, ...UNICODE), fc.string({ maxLength: 3 })), maxLength: 6 }),
    fc.integer(),
    fc.boolean(),
    fc.constant(null),
    fc.array(tie('v'), { maxLength: 3 }),
    fc.dictionary(fc.string({ maxLength: 5 }), tie('v'), { maxKeys: 3 }),
  ),
})).v;
const call: fc.Arbitrary<ToolCall> = fc.record({
  name: fc.oneof(fc.constantFrom('bash', 'python', 'finish'), fc.string({ unit: fc.constantFrom(...CONTROL, ...JSONISH, ...UNICODE, 'a', 'b'), maxLength: 4 })),
  arguments: fc.dictionary(fc.string({ maxLength: 6 }), argValue, { maxKeys: 3 }),
});

/** Hostile text: pieces of well-formed calls of every family (cut, nested, repeated), control tokens, JSON debris. */
function hostileMessage(own: ToolCallParser, others: readonly ToolCallParser[]): fc.Arbitrary<string> {
  const formatted = (p: ToolCallParser): fc.Arbitrary<string> => fc.array(call, { minLength: 1, maxLength: 3 }).map((calls) => p.format(calls));
  const nested = fc.tuple(call, formatted(own)).map(([c, inner]) => own.format([{ ...c, arguments: { ...c.arguments, code: inner } }]));
  const piece = fc.oneof(
    { weight: 4, arbitrary: formatted(own) },
    { weight: 2, arbitrary: nested },
    { weight: 1, arbitrary: fc.oneof(...others.map(formatted)) },
    { weight: 3, arbitrary: fc.constantFrom(...CONTROL) },
    { weight: 3, arbitrary: fc.constantFrom(...JSONISH) },
    { weight: 1, arbitrary: fc.constantFrom(...UNICODE) },
    { weight: 2, arbitrary: fc.string({ maxLength: 8 }) },
  );
  const cut = (text: string, a: number, b: number): string => {
    const x = Math.floor(a * (text.length + 1));
    const y = Math.floor(b * (text.length + 1));
    return text.slice(Math.min(x, y), Math.max(x, y));
  };
  return fc.oneof(
    fc.array(piece, { maxLength: 8 }).map((p) => p.join('')),
    // Truncated at both ends (a length stop, a continuation), and with a piece dropped in the middle.
    fc.tuple(fc.array(piece, { minLength: 1, maxLength: 6 }), fc.double({ min: 0, max: 1, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true })).map(([p, a, b]) => cut(p.join(''), a, b)),
    fc.tuple(formatted(own), fc.nat(), piece).map(([text, at, insert]) => {
      const k = at % (text.length + 1);
      return text.slice(0, k) + insert + text.slice(k);
    }),
  );
}

/** Canonical JSON (keys sorted) of a value, to compare a parsed value with the call's arguments. */
function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (typeof value === 'object' && value !== null) {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical((value as Record<string, unknown>)[k])}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

/**
 * Every JSON object the text writes (an independent oracle, by brute force): each slice from an opening `{` or `"` to
 * a closing `}` or `"` that JSON.parse accepts, the objects nested in what it gives, and the objects JSON strings among
 * them hold. The `{}` of a call written without arguments is always allowed.
 */
function writtenObjects(text: string): Set<string> {
  const out = new Set<string>(['{}']);
  const starts: number[] = [];
  const ends: number[] = [];
  for (let i = 0; i < text.length; i++) {
    if (text[i] === '{' || text[i] === '"') starts.push(i);
    if (text[i] === '}' || text[i] === '"') ends.push(i);
  }
  const visit = (v: unknown, depth: number): void => {
    if (depth > 80) return;
    if (typeof v === 'string') {
      if (depth > 0 && !/^\s*[{"]/.test(v)) return;
      try {
        visit(JSON.parse(v) as unknown, depth + 1);
      } catch {
        /* not JSON */
      }
      return;
    }
    if (typeof v !== 'object' || v === null) return;
    if (!Array.isArray(v)) out.add(canonical(v));
    for (const x of Object.values(v)) visit(x, depth + 1);
  };
  for (const s of starts) {
    for (const e of ends) {
      if (e <= s) continue;
      let value: unknown;
      try {
        value = JSON.parse(text.slice(s, e + 1));
      } catch {
        continue;
      }
      visit(value, 0);
    }
  }
  return out;
}

const FAMILY_PARSERS = { qwen3: 'hermes', gemma3: 'hermes', llama3_1: 'llama3_json', deepseek_v3: 'deepseek_v3' } as const;
const ALL = (['hermes', 'llama3_json', 'deepseek_v3'] as const).map((n) => createToolCallParser(n));

describe.each(Object.entries(FAMILY_PARSERS))('review s40: the %s tool-call parser (%s) on hostile text', (_family, name) => {
  it('never throws, and every call it returns is named and argued by the text', () => {
    const parser = createToolCallParser(name);
    const others = ALL.filter((p) => p.name !== name);
    fc.assert(
      fc.property(hostileMessage(parser, others), (text) => {
        const parsed = parser.parse(text);
        expect(Array.isArray(parsed.calls) && Array.isArray(parsed.errors)).toBe(true);
        if (parsed.calls.length === 0) return;
        const objects = writtenObjects(text);
        for (const c of parsed.calls) {
          expect(c.name.length).toBeGreaterThan(0);
          // A name is text of the message, or a JSON string of it (escapes decoded).
          const named = text.includes(c.name) || text.includes(JSON.stringify(c.name).slice(1, -1)) || [...objects].some((o) => o.includes(JSON.stringify(c.name).slice(1, -1)));
          expect(named, `name ${JSON.stringify(c.name)} not in ${JSON.stringify(text)}`).toBe(true);
          expect(objects.has(canonical(c.arguments)), `arguments ${canonical(c.arguments)} not written in ${JSON.stringify(text)}`).toBe(true);
        }
      }),
      FUZZ_MS > 0 ? { numRuns: Number.MAX_SAFE_INTEGER, interruptAfterTimeLimit: FUZZ_MS } : { numRuns: 300 },
    );
  }, FUZZ_MS + 60_000);
});
