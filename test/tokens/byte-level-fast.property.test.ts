import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { readModelFiles } from '../../src/tokens/model-files.js';
import { HfTokenizer } from '../../src/tokens/tokenizer.js';
import { FAMILIES, familyDir, type Family } from './families.js';

const pairs = new Map<Family, { fast: HfTokenizer; library: HfTokenizer }>();
beforeAll(async () => {
  for (const family of FAMILIES) {
    const { tokenizerJson, config } = await readModelFiles(familyDir(family));
    pairs.set(family, { fast: new HfTokenizer(tokenizerJson, config), library: new HfTokenizer(tokenizerJson, config, { accelerate: false }) });
  }
});

/** ASCII with every control character, space and DEL (what the fast path rewrites), mixed with non-ASCII and markup. */
const text = fc.oneof(
  fc.string({ unit: fc.integer({ min: 0, max: 0x7f }).map((c) => String.fromCharCode(c)), maxLength: 80 }),
  fc.string({ unit: fc.constantFrom(' ', '  ', '\n', '\r\n', '\t', '\x00', '\x7f', '\x1b', 'a', 'Z', '9', "'s", "'LL", '<|im_end|>', '<tool_call>', '{"x": 1}', 'é', '日本', '🙂', '\u2581'), maxLength: 40 }),
  fc.string({ unit: 'grapheme', maxLength: 60 }),
);

describe('the ByteLevel pre-tokenizer fast path (byte-level-fast.ts)', () => {
  it('is on for the ByteLevel families and off for Gemma 3 (and when asked not to be)', () => {
    expect(FAMILIES.map((f) => [f, pairs.get(f)!.fast.fastPreTokenize, pairs.get(f)!.library.fastPreTokenize])).toEqual([
      ['qwen3', true, false],
      ['llama3_1', true, false],
      ['deepseek_v3', true, false],
      ['gemma3', false, false],
    ]);
  });

  it('equals the library with the pre-tokenizer options no family here uses (ByteLevel alone: its own regex, a prefix space)', async () => {
    const { tokenizerJson, config } = await readModelFiles(familyDir('qwen3'));
    for (const options of [
      { add_prefix_space: true, use_regex: true },
      { add_prefix_space: true, use_regex: false },
      { add_prefix_space: false, use_regex: true },
    ]) {
      const json = { ...tokenizerJson, pre_tokenizer: { type: 'ByteLevel', trim_offsets: false, ...options } };
      const fast = new HfTokenizer(json, config);
      const library = new HfTokenizer(json, config, { accelerate: false });
      expect(fast.fastPreTokenize).toBe(true);
      fc.assert(
        fc.property(text, (t) => {
          expect(fast.encodeUncached(t)).toEqual(library.encodeUncached(t));
        }),
        { numRuns: 200 },
      );
    }
  });

  for (const family of FAMILIES) {
    it(`${family}: encodes exactly as the library does (encode, encodeUncached, encodeText)`, () => {
      const { fast, library } = pairs.get(family)!;
      fc.assert(
        fc.property(text, (t) => {
          expect(fast.encodeUncached(t)).toEqual(library.encodeUncached(t));
          expect(fast.encode(t)).toEqual(library.encode(t));
          expect(fast.encodeText(t)).toEqual(library.encodeText(t));
        }),
        { numRuns: 400 },
      );
    });
  }
});
