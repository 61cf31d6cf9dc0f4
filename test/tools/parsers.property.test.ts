import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { TOOL_CALL_PARSERS } from '../../src/config.js';
import { createToolCallParser } from '../../src/tools/parsers.js';
import type { ToolCall } from '../../src/tools/types.js';

const name = fc.stringMatching(/^[a-z_][a-z0-9_]{0,15}$/);
const args = fc.dictionary(fc.string({ maxLength: 8 }), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 4 }) as fc.Arbitrary<Record<string, unknown>>;
const calls = fc.array(fc.record({ name, arguments: args }), { minLength: 1, maxLength: 3 }) as fc.Arbitrary<ToolCall[]>;

describe.each(TOOL_CALL_PARSERS)('the %s parser', (parserName) => {
  const parser = createToolCallParser(parserName);

  it('reads back exactly the calls it writes', () => {
    fc.assert(
      fc.property(calls, (cs) => {
        // JSON round trip: -0 becomes 0, as it would through any engine's text.
        expect(parser.parse(parser.format(cs))).toEqual({ calls: JSON.parse(JSON.stringify(cs)) as unknown, errors: [] });
      }),
      { numRuns: 200 },
    );
  });

  it('never throws, whatever the model writes', () => {
    const pieces = fc.array(fc.oneof(fc.string(), fc.constantFrom('{', '}', '"name"', ':', ';', '<|python_tag|>', '<tool_call>', '</tool_call>', '<｜tool▁calls▁begin｜>', '<｜tool▁call▁begin｜>', '<｜tool▁sep｜>', '```json\n', '\n```', '<｜tool▁call▁end｜>')), { maxLength: 12 });
    fc.assert(
      fc.property(pieces, (ps) => {
        const out = parser.parse(ps.join(''));
        expect(Array.isArray(out.calls) && Array.isArray(out.errors)).toBe(true);
      }),
      { numRuns: 300 },
    );
  });
});
