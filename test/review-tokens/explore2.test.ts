import { describe, it } from 'vitest';
import { FAMILIES, loadFamily } from '../tokens/families.js';

describe('explore2', () => {
  it.each(FAMILIES)('%s', async (family) => {
    const b = await loadFamily(family);
    const t = b.tokenizer;
    const structural = t.addedTokens.filter((s) => !t.textTokens.has(s));
    const ids = new Set(structural.map((s) => t.tokenId(s)!));
    const allAdded = new Set(t.addedTokens.map((s) => t.tokenId(s)!));
    let bad: string[] = [];
    for (const s of structural) {
      let enc: number[];
      try { enc = t.encodeText(s); } catch (e) { bad.push(`${s}: THROW ${(e as Error).message}`); continue; }
      if (enc.some((id) => ids.has(id))) bad.push(`${s} -> ${enc}`);
    }
    // also: strings with spaces (gemma normalizer)
    console.log(family, 'structural', structural.length, 'text', t.textTokens.size, 'bad', bad.length, bad.slice(0, 10));
    // text tokens in vocab: which plain encodings produce text tokens
    console.log(family, 'textTokens sample', [...t.textTokens].slice(0, 20).map((x) => JSON.stringify(x)).join(' '));
  });
});
