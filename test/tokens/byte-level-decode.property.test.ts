import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { ByteLevelDecoder } from '../../src/tokens/byte-level-decode.js';
import type { HfTokenizer } from '../../src/tokens/tokenizer.js';
import { FAMILIES, loadFamily, type Family } from './families.js';

const tokenizers = new Map<Family, HfTokenizer>();
beforeAll(async () => {
  for (const family of FAMILIES) tokenizers.set(family, (await loadFamily(family)).tokenizer);
});

/** Texts whose tokens split multi-byte characters, hold added tokens, whitespace runs and look-alikes. */
const text = fc.oneof(
  fc.string({ unit: 'grapheme', maxLength: 60 }),
  fc.string({ unit: fc.constantFrom(' ', '\n', 'a', 'é', '日本', '🙂', '\u{F0000}', '<|im_end|>', '<tool_call>', '<|eot_id|>', '<think>', '<｜end▁of▁sentence｜>', '\uFEFF'), maxLength: 30 }),
);

describe('ByteLevel decoding from the table (byte-level-decode.ts)', () => {
  it('is used for the ByteLevel families (Qwen3, Llama 3.1, DeepSeek-V3) and not for Gemma 3 (its decoder is a sequence)', () => {
    expect(FAMILIES.map((f) => [f, tokenizers.get(f)!.fastDecode])).toEqual([
      ['qwen3', true],
      ['llama3_1', true],
      ['deepseek_v3', true],
      ['gemma3', false],
    ]);
  });

  for (const family of FAMILIES.filter((f) => f !== 'gemma3')) {
    it(`${family}: equals the library's decode on any ids, with and without skipping special tokens`, () => {
      const tokenizer = tokenizers.get(family)!;
      // Ids anywhere in the table (added and special ones included), the ids of real text cut anywhere (a multi-byte
      // character split between runs), and ids past the vocabulary.
      const ids = fc.oneof(
        fc.array(fc.integer({ min: 0, max: tokenizer.vocabSize - 1 }), { maxLength: 40 }),
        fc.tuple(text, fc.nat(), fc.nat()).map(([t, a, b]) => {
          const all = tokenizer.encode(t);
          return all.slice(Math.min(a, b) % (all.length + 1), Math.max(a, b) % (all.length + 1) + 1);
        }),
        fc.array(fc.oneof(fc.integer({ min: 0, max: tokenizer.vocabSize + 50 }), fc.constantFrom(...tokenizer.stopTokenIds)), { maxLength: 20 }),
      );
      fc.assert(
        fc.property(ids, fc.boolean(), (list, skip) => {
          expect(tokenizer.decode(list, { skipSpecialTokens: skip })).toBe(tokenizer.decodeWithLibrary(list, { skipSpecialTokens: skip }));
        }),
        { numRuns: 400 },
      );
    });

    it(`${family}: equals it on every id alone`, () => {
      const tokenizer = tokenizers.get(family)!;
      for (let id = 0; id < tokenizer.vocabSize + 2; id++) {
        // Two ids, so the single-id cache of HfTokenizer.decode is not what answers.
        const pair = [id, id];
        if (tokenizer.decode(pair) !== tokenizer.decodeWithLibrary(pair)) {
          expect.fail(`id ${id}: ${JSON.stringify(tokenizer.decode(pair))} != ${JSON.stringify(tokenizer.decodeWithLibrary(pair))}`);
        }
      }
    });
  }

  it('refuses what the table cannot represent: another decoder, an end-of-word suffix, a token outside the byte alphabet', () => {
    const base = { decoder: { type: 'ByteLevel' }, model: { type: 'BPE', vocab: { a: 0, 'Ġb': 1 } }, added_tokens: [] };
    expect(ByteLevelDecoder.from(base)?.decode([0, 1], false)).toBe('a b');
    expect(ByteLevelDecoder.from({ ...base, decoder: { type: 'Metaspace' } })).toBeUndefined();
    expect(ByteLevelDecoder.from({ ...base, model: { ...base.model, end_of_word_suffix: '</w>' } })).toBeUndefined();
    expect(ByteLevelDecoder.from({ ...base, model: { ...base.model, vocab: { a: 0, '日': 1 } } })).toBeUndefined();
  });

  it('decodes an id without a token as the unk token, or as nothing when there is none', () => {
    const vocab = { a: 0, '<unk>': 1, c: 3 };
    const withUnk = ByteLevelDecoder.from({ decoder: { type: 'ByteLevel' }, model: { type: 'BPE', vocab, unk_token: '<unk>' }, added_tokens: [] })!;
    const without = ByteLevelDecoder.from({ decoder: { type: 'ByteLevel' }, model: { type: 'BPE', vocab }, added_tokens: [] })!;
    // id 2 is a hole, 9 is past the table.
    expect(withUnk.decode([0, 2, 3, 9], false)).toBe('a<unk>c<unk>');
    expect(without.decode([0, 2, 3, 9], false)).toBe('ac');
  });
});
