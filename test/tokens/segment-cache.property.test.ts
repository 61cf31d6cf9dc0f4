import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { loadQwen3, type HfTokenizer } from '../../src/tokens/tokenizer.js';
import type { ChatTemplate } from '../../src/tokens/types.js';

let tokenizer: HfTokenizer;
let template: ChatTemplate;
beforeAll(async () => {
  ({ tokenizer, template } = await loadQwen3());
});

const SPECIALS = ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<tool_call>', '</tool_call>', '<think>', '</think>', '<tool_response>'];
const piece = fc.oneof(
  fc.constantFrom(...SPECIALS),
  fc.string({ unit: 'grapheme', maxLength: 40 }),
  fc.string({ unit: fc.constantFrom(' ', '\n', '\t', 'a', 'é', '1', '<', '|', '>', '_', '日'), maxLength: 30 }),
  fc.constantFrom('system\nYou are a helpful assistant.'.repeat(3), '\n\n', ' ', 'assistant\n'),
);

describe('the segment-cached encode', () => {
  it('equals the library encode of the whole text, for any mix of text and added tokens', () => {
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 12 }), (pieces) => {
        const text = pieces.join('');
        // Twice: the second call goes through the cache.
        expect(tokenizer.encode(text)).toEqual(tokenizer.encodeUncached(text));
        expect(tokenizer.encode(text)).toEqual(tokenizer.encodeUncached(text));
      }),
      { numRuns: 300 },
    );
  });

  it('equals it on real rendered conversations with tools', () => {
    const tools = [{ type: 'function' as const, function: { name: 'python', description: 'Run Python.', parameters: { type: 'object', properties: { code: { type: 'string' } } } } }];
    const text = template.render(
      [
        { role: 'system', content: 'Solve it.' },
        { role: 'user', content: 'What is 2 + 2?' },
        { role: 'assistant', content: '<tool_call>\n{"name": "python", "arguments": {"code": "print(2+2)"}}\n</tool_call>' },
        { role: 'tool', content: '4' },
      ],
      { addGenerationPrompt: true, tools },
    );
    expect(tokenizer.encode(text)).toEqual(tokenizer.encodeUncached(text));
    expect(tokenizer.encode(text)).toEqual(tokenizer.encodeUncached(text));
  });
});

/** Text with every added-token string taken out (repeatedly: removing one can join the halves of another). */
function withoutAddedTokens(text: string): string {
  let out = text;
  for (let before = ''; before !== out; ) {
    before = out;
    for (const token of tokenizer.addedTokens) out = out.split(token).join('');
  }
  return out;
}

const addedPattern = (): RegExp =>
  new RegExp([...tokenizer.addedTokens].sort((a, b) => b.length - a.length).map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|'), 'g');
const addedIds = (): Set<number> => new Set(tokenizer.addedTokens.map((t) => tokenizer.tokenId(t)!));
const parts = fc.array(fc.record({ text: fc.array(piece, { maxLength: 4 }).map((p) => p.join('')), literal: fc.boolean() }), { maxLength: 8 });

describe('plain-text encoding (added tokens not recognized)', () => {
  it('equals the normal encode for text without added-token strings', () => {
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 12 }), (pieces) => {
        const text = withoutAddedTokens(pieces.join(''));
        expect(tokenizer.encodeText(text)).toEqual(tokenizer.encodeUncached(text));
      }),
      { numRuns: 300 },
    );
  });

  it('never yields an added-token id, and decodes back to the text', () => {
    const ids = addedIds();
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 12 }), (pieces) => {
        const text = pieces.join('').normalize('NFC');
        const encoded = tokenizer.encodeText(text);
        expect(encoded.filter((id) => ids.has(id))).toEqual([]);
        expect(tokenizer.decode(encoded)).toBe(text);
      }),
      { numRuns: 300 },
    );
  });
});

describe('encodeParts', () => {
  it('equals the uncached encode of the joined text when no part is literal', () => {
    fc.assert(
      fc.property(parts, (ps) => {
        const template = ps.map((p) => ({ ...p, literal: false }));
        expect(tokenizer.encodeParts(template)).toEqual(tokenizer.encodeUncached(ps.map((p) => p.text).join('')));
      }),
      { numRuns: 300 },
    );
  });

  it('yields the added tokens of the template parts only, and decodes to the joined text', () => {
    const ids = addedIds();
    fc.assert(
      fc.property(parts, (ps) => {
        const normalized = ps.map((p) => ({ ...p, text: p.text.normalize('NFC') }));
        const encoded = tokenizer.encodeParts(normalized);
        // Runs of template text, cut at literal parts.
        const runs = [''];
        for (const p of normalized) {
          if (p.literal) runs.push('');
          else runs[runs.length - 1] += p.text;
        }
        const written = runs.flatMap((run) => [...run.matchAll(addedPattern())].map((m) => m[0]));
        expect(encoded.filter((id) => ids.has(id)).map((id) => tokenizer.decode([id]))).toEqual(written);
        expect(tokenizer.decode(encoded)).toBe(normalized.map((p) => p.text).join('').normalize('NFC'));
      }),
      { numRuns: 300 },
    );
  });
});
