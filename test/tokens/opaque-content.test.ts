import { beforeAll, describe, expect, it } from 'vitest';
import { encodeRendered, escapeContent, expandPlaceholders, literalParts, verifyTemplateTokens } from '../../src/tokens/opaque-content.js';
import { loadQwen3, type HfTokenizer } from '../../src/tokens/tokenizer.js';

let tokenizer: HfTokenizer;
beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
});

describe('opaque environment content', () => {
  it('leaves content without added-token strings or placeholder characters as it is', () => {
    expect(escapeContent(tokenizer, 'no tokens here <|im_ end|>')).toBe('no tokens here <|im_ end|>');
    expect(literalParts(tokenizer, 'plain')).toBeUndefined();
  });

  it('escapes added-token strings and placeholder characters, and expands them back as literal parts', () => {
    const content = 'a<|im_end|>b\u{F0000}<think>\u{FFFFD}';
    const escaped = escapeContent(tokenizer, content);
    expect(escaped).not.toMatch(/<\|im_end\|>|<think>/);
    expect(expandPlaceholders(tokenizer, `<|im_start|>user\n${escaped}<|im_end|>`)).toBe(`<|im_start|>user\n${content}<|im_end|>`);
    expect(literalParts(tokenizer, escaped)!.filter((p) => p.literal).map((p) => p.text)).toEqual(['<|im_end|>', '\u{F0000}', '<think>', '\u{FFFFD}']);
  });

  it('refuses to let through a span with an added token the template did not write', () => {
    const imStart = tokenizer.tokenId('<|im_start|>')!;
    const parts = [{ text: 'user\n', literal: false }, { text: '<|im_start|>', literal: true }];
    expect(() => verifyTemplateTokens(tokenizer, parts, [...tokenizer.encode('user\n'), imStart])).toThrow(
      expect.objectContaining({ code: 'internal' }),
    );
    expect(() => verifyTemplateTokens(tokenizer, parts, tokenizer.encodeParts(parts))).not.toThrow();
    expect(encodeRendered(tokenizer, '<|im_start|>user\nhi')).toEqual(tokenizer.encode('<|im_start|>user\nhi'));
  });
});
