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
