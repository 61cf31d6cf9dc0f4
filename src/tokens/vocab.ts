import type { Tokenizer } from './types.js';

const sizes = new WeakMap<Tokenizer, number>();

/**
 * How many ids the tokenizer knows: valid ids are the integers in [0, vocabSize). Engine answers are checked
 * against it, because an id outside the vocabulary decodes to "" without complaint and would otherwise reach the
 * trainer as a sampled token (then be scored as an empty answer).
 *
 * Uses `tokenizer.vocabSize` when the implementation has one; otherwise finds the first id that decodes to
 * nothing, by doubling then bisecting (~40 decodes, once per tokenizer). That relies on the vocabulary being the
 * contiguous range [0, n) and every id in it decoding to at least one character — true of Hugging Face
 * tokenizers (byte-level BPE decodes a partial byte to U+FFFD; Qwen3's 151,669 ids all decode non-empty).
 */
export function vocabSize(tokenizer: Tokenizer): number {
  const declared = (tokenizer as { vocabSize?: unknown }).vocabSize;
  if (typeof declared === 'number' && Number.isInteger(declared) && declared > 0) return declared;
  let size = sizes.get(tokenizer);
  if (size === undefined) {
    size = probe(tokenizer);
    sizes.set(tokenizer, size);
  }
  return size;
}

function probe(tokenizer: Tokenizer): number {
  const known = (id: number): boolean => {
    try {
      return tokenizer.decode([id]) !== '';
    } catch {
      return false;
    }
  };
  if (!known(0)) return 0;
  let lo = 0; // known
  let hi = 1;
  while (known(hi)) {
    lo = hi;
    hi *= 2;
    if (hi > 2 ** 31) return hi; // not a vocabulary: no bound worth enforcing
  }
  while (hi - lo > 1) {
    const mid = lo + Math.floor((hi - lo) / 2);
    if (known(mid)) lo = mid;
    else hi = mid;
  }
  return hi;
}
