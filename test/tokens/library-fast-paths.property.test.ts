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

/** Asserts that `fast` encodes random texts exactly as `library` does, through encode, encodeUncached and encodeText. */
function encodesAsLibrary(fast: HfTokenizer, library: HfTokenizer, numRuns: number): void {
  fc.assert(
    fc.property(text, (t) => {
      expect(fast.encodeUncached(t)).toEqual(library.encodeUncached(t));
      expect(fast.encode(t)).toEqual(library.encode(t));
      expect(fast.encodeText(t)).toEqual(library.encodeText(t));
    }),
    { numRuns },
  );
}

describe('the library fast paths (byte-level-fast.ts, library-fast-paths.ts)', () => {
  it('is on for the ByteLevel families and off for Gemma 3 (and when asked not to be)', () => {
    expect(FAMILIES.map((f) => [f, pairs.get(f)!.fast.fastPreTokenize, pairs.get(f)!.library.fastPreTokenize])).toEqual([
      ['qwen3', true, false],
      ['llama3_1', true, false],
      ['deepseek_v3', true, false],
      ['gemma3', false, false],
    ]);
  });

  it('library-fast-paths.ts is on for every family (where its conditions hold), off when asked', () => {
    // Two library instances per tokenizer (with and without added tokens), each a Sequence and its children or one Split.
    expect(FAMILIES.map((f) => [f, pairs.get(f)!.fast.fastPaths])).toEqual([
      ['qwen3', { preTokenizersWithoutFlat: 6, splitsByMatch: 2, bpeCaches: 2, segmentEncoders: 2, bpeDataReleased: true }],
      ['llama3_1', { preTokenizersWithoutFlat: 6, splitsByMatch: 2, bpeCaches: 2, segmentEncoders: 2, bpeDataReleased: true }],
      // DeepSeek-V3 has added tokens matched after normalization: its own segments keep the library's encode.
      ['deepseek_v3', { preTokenizersWithoutFlat: 10, splitsByMatch: 6, bpeCaches: 2, segmentEncoders: 1, bpeDataReleased: true }],
      ['gemma3', { preTokenizersWithoutFlat: 2, splitsByMatch: 2, bpeCaches: 2, segmentEncoders: 2, bpeDataReleased: true }],
    ]);
    for (const family of FAMILIES) {
      expect(pairs.get(family)!.library.fastPaths, family).toEqual({ preTokenizersWithoutFlat: 0, splitsByMatch: 0, bpeCaches: 0, segmentEncoders: 0, bpeDataReleased: false });
    }
  });

  it('releases the BPE construction data from its own copy of tokenizer.json, never from the caller\'s', async () => {
    for (const family of FAMILIES) {
      const { tokenizerJson, config } = await readModelFiles(familyDir(family));
      const model = tokenizerJson.model as { vocab: Record<string, number>; merges: unknown[] };
      const [vocab, merges] = [model.vocab, model.merges];
      const released = new HfTokenizer(tokenizerJson, config);
      expect(released.fastPaths.bpeDataReleased, family).toBe(true);
      // The caller's object is as it was: a second tokenizer built from it (which needs both) encodes the same.
      expect(tokenizerJson.model, family).toBe(model);
      expect([model.vocab, model.merges], family).toEqual([vocab, merges]);
      const again = new HfTokenizer(tokenizerJson, config, { accelerate: false });
      const sample = 'Hello <|im_end|> wörld 🙂 {"x": 1}\n\tdone';
      expect(released.encode(sample), family).toEqual(again.encode(sample));
      expect(released.encodeText(sample), family).toEqual(again.encodeText(sample));
    }
  });

  it('equals the library past the BPE word cache\'s capacity (10,000 words: evictions, then words seen again)', () => {
    // Distinct words (base-36 numbers in letters) in batches, each batch encoded twice, so the word cache fills,
    // evicts its least recently used words and is asked again for some it dropped.
    const word = (n: number): string => n.toString(36).replace(/[0-9]/g, (d) => 'qrstuvwxyz'[Number(d)]!);
    for (const family of FAMILIES) {
      const { fast, library } = pairs.get(family)!;
      for (let batch = 0; batch < 14; batch++) {
        const text = Array.from({ length: 1_000 }, (_, i) => word(((batch * 7919 + i) % 13_000) + 50_000)).join(' ');
        expect(fast.encodeUncached(text), `${family} batch ${batch}`).toEqual(library.encodeUncached(text));
        expect(fast.encodeText(text), `${family} batch ${batch}`).toEqual(library.encodeText(text));
      }
    }
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

  it('equals the library with Split pre-tokenizers whose matches do not tile the text, or that it leaves alone', async () => {
    const { tokenizerJson, config } = await readModelFiles(familyDir('qwen3'));
    const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false };
    for (const [split, patched] of [
      [{ type: 'Split', pattern: { Regex: '\\p{N}{1,3}' }, behavior: 'Isolated', invert: false }, 2], // digits only: gaps
      [{ type: 'Split', pattern: { Regex: '\\s*' }, behavior: 'Isolated', invert: false }, 2], // empty matches
      [{ type: 'Split', pattern: { String: ' ' }, behavior: 'Isolated', invert: false }, 2],
      [{ type: 'Split', pattern: { Regex: '\\p{L}+' }, behavior: 'Isolated', invert: true }, 0],
      [{ type: 'Split', pattern: { String: ' ' }, behavior: 'Removed', invert: false }, 0],
    ] as const) {
      const json = { ...tokenizerJson, pre_tokenizer: { type: 'Sequence', pretokenizers: [split, byteLevel] } };
      const fast = new HfTokenizer(json, config);
      const library = new HfTokenizer(json, config, { accelerate: false });
      expect(fast.fastPaths.splitsByMatch, JSON.stringify(split)).toBe(patched);
      encodesAsLibrary(fast, library, 150);
    }
  });

  for (const family of FAMILIES) {
    it(`${family}: encodes exactly as the library does (encode, encodeUncached, encodeText)`, () => {
      const { fast, library } = pairs.get(family)!;
      encodesAsLibrary(fast, library, 400);
    });
  }
});
