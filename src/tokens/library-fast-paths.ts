import * as hf from '@huggingface/tokenizers';
import { LRUCache } from 'lru-cache';

// Exported by the library at run time; its type declarations re-export them through paths TypeScript's NodeNext
// resolution does not follow, so they are named here.
type Class = abstract new (...args: never[]) => object;
const { PreTokenizer, SequencePreTokenizer, BPE } = hf as unknown as { PreTokenizer: Class; SequencePreTokenizer: Class; BPE: Class };

interface PreTokenizerFields {
  pre_tokenize(text: string | string[], options?: unknown): string[];
  pre_tokenize_text(text: string, options?: unknown): string[];
}

/** The base class's `pre_tokenize`, which no pre-tokenizer of the library overrides (0.2.0). */
const basePreTokenize = (PreTokenizer.prototype as Partial<PreTokenizerFields>).pre_tokenize;

/** Every pre-tokenizer instance of a tokenizer: its own and those inside a Sequence, depth first. */
export function preTokenizers(tokenizer: hf.Tokenizer): object[] {
  const found: object[] = [];
  const visit = (node: unknown): void => {
    if (!(node instanceof PreTokenizer)) return;
    found.push(node);
    if (node instanceof SequencePreTokenizer) for (const child of (node as unknown as { tokenizers?: unknown[] }).tokenizers ?? []) visit(child);
  };
  visit((tokenizer as unknown as { pre_tokenizer?: unknown }).pre_tokenizer);
  return found;
}

/**
 * The library's `PreTokenizer.pre_tokenize` maps a list of texts to a list of lists and flattens it with
 * `Array.prototype.flat`, which V8 runs element by element through a generic path: inside a Sequence (Qwen3, Llama 3,
 * DeepSeek-V3: a Split, then ByteLevel on each of its pieces) that was a third of the time to encode a 55K-token
 * prompt. Replaced, per instance, by the same concatenation in a loop; only where the instance still has the base
 * class's method. Returns how many were patched.
 */
export function flattenWithoutFlat(tokenizer: hf.Tokenizer): number {
  let patched = 0;
  for (const node of preTokenizers(tokenizer)) {
    const fields = node as unknown as PreTokenizerFields;
    if (basePreTokenize === undefined || fields.pre_tokenize !== basePreTokenize) continue;
    fields.pre_tokenize = (text: string | string[], options?: unknown): string[] => {
      if (!Array.isArray(text)) return fields.pre_tokenize_text(text, options);
      const out: string[] = [];
      for (const piece of text) for (const token of fields.pre_tokenize_text(piece, options)) out.push(token);
      return out;
    };
    patched++;
  }
  return patched;
}

/** The BPE model's word cache as the library uses it. */
interface WordCache {
  get(key: string): string[] | undefined;
  put(key: string, value: string[]): void;
  clear(): void;
}

/**
 * The BPE model caches the merges of each word it has seen (up to `cache_capacity`, 10,000) in an LRU built on a Map
 * that deletes and sets a key again on every hit. V8 leaves a deleted entry in its key's hash chain until the table
 * is rebuilt, so the hot words of a text (log lines repeat them thousands of times) make their chains, and every
 * later lookup, longer: a sixth of the time to encode a 55K-token log. Replaced, per model, by lru-cache with the
 * same capacity (the same words cached, the same ones evicted first). Returns whether the model was a BPE.
 */
export function bpeCacheOnLruCache(tokenizer: hf.Tokenizer): boolean {
  const model = (tokenizer as unknown as { model?: unknown }).model;
  if (!(model instanceof BPE)) return false;
  const fields = model as unknown as { cache: WordCache; cache_capacity: number };
  if (!Number.isInteger(fields.cache_capacity) || fields.cache_capacity < 1) return false;
  const lru = new LRUCache<string, string[]>({ max: fields.cache_capacity });
  fields.cache = {
    get: (key) => lru.get(key),
    put: (key, value) => {
      lru.set(key, value);
    },
    clear: () => {
      lru.clear();
    },
  };
  return true;
}
