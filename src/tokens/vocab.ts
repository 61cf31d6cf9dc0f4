import type { Tokenizer } from './types.js';

const sizes = new WeakMap<Tokenizer, number>();

/**
 * How many ids the model can sample: valid ids are the integers in [0, vocabSize). Engine answers are checked
 * against it, because an id outside the model's vocabulary cannot have been sampled (an engine or proxy fault); it
 * would decode to "" without complaint and otherwise reach the trainer as a sampled token.
 *
 * Uses `tokenizer.modelVocabSize` (HfTokenizer: the larger of the tokenizer's ids and config.json's vocab_size, whose
 * padding rows the engine can sample) or else `tokenizer.vocabSize` when the implementation has one; otherwise finds the first id that decodes to
 * nothing, by doubling then bisecting (~40 decodes, once per tokenizer). That relies on the vocabulary being the
 * contiguous range [0, n) and every id in it decoding to at least one character — true of Hugging Face
 * tokenizers (byte-level BPE decodes a partial byte to U+FFFD; Qwen3's 151,669 ids all decode non-empty).
 */
export function vocabSize(tokenizer: Tokenizer): number {
  const { modelVocabSize: model, vocabSize: declared } = tokenizer as { modelVocabSize?: unknown; vocabSize?: unknown };
  if (typeof model === 'number' && Number.isInteger(model) && model > 0) return model;
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
