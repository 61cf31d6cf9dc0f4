import * as hf from '@huggingface/tokenizers';
import { LRUCache } from 'lru-cache';

// Exported by the library at run time; its type declarations re-export them through paths TypeScript's NodeNext
// resolution does not follow, so they are named here.
type Class = abstract new (...args: never[]) => object;
export const libraryClasses = hf as unknown as {
  PreTokenizer: Class;
  SequencePreTokenizer: Class;
  SplitPreTokenizer: Class;
  ByteLevelPreTokenizer: Class;
  BPE: Class;
};
const { PreTokenizer, SequencePreTokenizer, SplitPreTokenizer, BPE } = libraryClasses;

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

interface SplitFields {
  config: { invert?: boolean; behavior?: string };
  pattern: RegExp | null;
  pre_tokenize_text(text: string, options?: unknown): string[];
}

/**
 * The Split pre-tokenizer (the GPT-2/GPT-4 style regex of Qwen3, Llama 3, DeepSeek-V3) keeps the text between
 * matches and the matches themselves, in order, found with `matchAll`: a match object per piece (~20K for a 55K-token
 * log). Those regexes match every character, so the matches alone usually tile the text; `String.match` finds the
 * same matches (the same lastIndex stepping) as an array of strings, natively. Where they tile it — no empty match,
 * lengths adding up to the text's — that array is exactly the library's result; anything else goes to the library.
 * Patched per instance, only on the path the library takes for the pattern (`invert` off, behaviour not "removed").
 * Returns how many were patched.
 */
export function splitByMatch(tokenizer: hf.Tokenizer): number {
  let patched = 0;
  for (const node of preTokenizers(tokenizer)) {
    if (!(node instanceof SplitPreTokenizer)) continue;
    const fields = node as unknown as SplitFields;
    const { pattern } = fields;
    if (pattern === null || !pattern.global || fields.config.invert || fields.config.behavior?.toLowerCase() === 'removed') continue;
    const original = fields.pre_tokenize_text.bind(node);
    fields.pre_tokenize_text = (text: string, options?: unknown): string[] => {
      const matches = text.match(pattern);
      if (matches === null) return original(text, options);
      let length = 0;
      for (const match of matches) {
        if (match.length === 0) return original(text, options);
        length += match.length;
      }
      return length === text.length ? matches : original(text, options);
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

/** The parts of the library's Tokenizer (0.2.0) that its encode runs through, as `segmentEncoder` reads them. */
interface LibraryTokenizer {
  remove_space?: boolean;
  do_lowercase_and_remove_accent?: boolean;
  normalizer: ((text: string) => string) | null;
  pre_tokenizer: ((text: string, options: { section_index: number }) => string[]) | null;
  model: ((tokens: string[]) => string[]) & { tokens_to_ids: Map<string, number>; unk_token_id: number | undefined };
  post_processor: ((tokens: string[], pair: null, addSpecialTokens: boolean) => { tokens: string[] }) | null;
  added_tokens: readonly { content: string; normalized: boolean }[];
  added_tokens_map: Map<string, { id: number }>;
}

/**
 * `tokenizer.encode(text, { add_special_tokens: false }).ids` for text that holds no added token, without the steps
 * that only matter when it does. The library's encode cuts the text at added tokens by walking a trie character by
 * character, flattens its sections and sub-sections with Array.flatMap and maps every token back through Maps: on a
 * 55K-token prompt, half of encode's time around the normalizer, pre-tokenizer and BPE that do the work. With no
 * added token in the text there is one section, so this runs exactly those steps, in the library's order, on the
 * whole text: normalizer, pre-tokenizer (section 0), model, post-processor (without special tokens), ids.
 *
 * Undefined (use the library) for tokenizers whose encode does more for such text: `remove_space`, lower-casing, or
 * added tokens matched after normalization. The caller guarantees the text holds no added token's content; a text
 * that becomes one after normalization, or is empty, is left to the library (`fallback`).
 */
export function segmentEncoder(tokenizer: hf.Tokenizer, fallback: (text: string) => number[]): ((text: string) => number[]) | undefined {
  const t = tokenizer as unknown as LibraryTokenizer;
  if (t.remove_space === true || t.do_lowercase_and_remove_accent === true) return undefined;
  if (typeof t.model !== 'function' || !(t.model.tokens_to_ids instanceof Map) || !(t.added_tokens_map instanceof Map)) return undefined;
  if (t.normalizer !== null && t.added_tokens.some((a) => a.normalized)) return undefined;
  const { normalizer, pre_tokenizer: preTokenizer, model, post_processor: postProcessor, added_tokens_map: added } = t;
  const vocab = model.tokens_to_ids;
  return (text: string): number[] => {
    if (text.length === 0) return fallback(text);
    const normalized = normalizer === null ? text : normalizer(text);
    if (normalized.length === 0 || added.has(normalized)) return fallback(text);
    let tokens = model(preTokenizer === null ? [normalized] : preTokenizer(normalized, { section_index: 0 }));
    if (postProcessor !== null) tokens = postProcessor(tokens, null, false).tokens;
    const ids = new Array<number>(tokens.length);
    for (let i = 0; i < tokens.length; i++) {
      const token = tokens[i]!;
      ids[i] = added.get(token)?.id ?? vocab.get(token) ?? model.unk_token_id!;
    }
    return ids;
  };
}

/** The BPE model's fields built from tokenizer.json that it only reads while it is constructed (0.2.0). */
interface BpeConstructionFields {
  config: { vocab?: unknown; merges?: unknown };
  merges: unknown;
  bpe_ranks: Map<string, number>;
}

/**
 * The library's BPE model keeps, for as long as it lives, what it was built from: tokenizer.json's `vocab` object
 * (151K properties for Qwen3) and `merges` (151K two-string arrays), besides what it encodes with (`tokens_to_ids`,
 * `vocab`, `bpe_ranks`); and the second, added-token-free instance (see HfTokenizer.plain) builds its own
 * `bpe_ranks` (151K JSON string keys) from the same merges. That was 34 of the 75-81 MB a Qwen3 tokenizer holds on
 * the V8 heap, in every isolate that loads one (the event loop and each token thread), and every full collection
 * marks all of it again: one of a process holding a tokenizer took 49-53 ms with it, 36-38 without.
 *
 * `plain` is given `tokenizer`'s `bpe_ranks` when both were built from the same model object (the same ranks: a
 * function of its `merges` only, in either of their formats); then both drop their construction data (the model
 * object's `vocab` and `merges`, each model's `merges`), which the library reads nowhere after its constructor. That
 * model object is deleted from, so it must be the caller's own copy of tokenizer.json's `model` (HfTokenizer makes
 * one). Only BPE models; returns whether it applied.
 */
export function releaseBpeConstructionData(tokenizer: hf.Tokenizer, plain: hf.Tokenizer): boolean {
  const a = (tokenizer as unknown as { model?: unknown }).model;
  const b = (plain as unknown as { model?: unknown }).model;
  if (!(a instanceof BPE) || !(b instanceof BPE)) return false;
  const first = a as unknown as BpeConstructionFields;
  const second = b as unknown as BpeConstructionFields;
  if (!(first.bpe_ranks instanceof Map) || !(second.bpe_ranks instanceof Map) || first.config !== second.config) return false;
  second.bpe_ranks = first.bpe_ranks;
  for (const model of [first, second]) model.merges = undefined;
  delete first.config.vocab;
  delete first.config.merges;
  return true;
}
