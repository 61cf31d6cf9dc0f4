import { encodeRendered } from './opaque-content.js';
import type { Tokenizer } from './types.js';

const MAX_ENTRIES = 1024;
const caches = new WeakMap<Tokenizer, Map<string, readonly number[]>>();

/**
 * Encodes a rendered prompt, remembering the last ~1,000 prompts per tokenizer. Every sample of a GRPO group
 * starts from the same prompt, so a group of n pays for one encode instead of n (the prompt encode was ~17% of
 * server CPU in bench/orchestration). The returned array is frozen and shared: copy before changing it.
 *
 * `text` is rendered from escaped messages (see opaque-content.ts): the prompt's contents come from the task
 * instance, i.e. from a dataset, and must not forge control tokens any more than a tool may.
 */
export function encodePrompt(tokenizer: Tokenizer, text: string): readonly number[] {
  let cache = caches.get(tokenizer);
  if (!cache) caches.set(tokenizer, (cache = new Map()));
  const hit = cache.get(text);
  if (hit) {
    // Refresh its place in the insertion order (Map order is the LRU order).
    cache.delete(text);
    cache.set(text, hit);
    return hit;
  }
  const ids = Object.freeze(encodeRendered(tokenizer, text));
  cache.set(text, ids);
  if (cache.size > MAX_ENTRIES) cache.delete(cache.keys().next().value!);
  return ids;
}
