import { runInNewContext } from 'node:vm';
import { setFlagsFromString } from 'node:v8';
import { describe, expect, it } from 'vitest';
import { detachedCopy, loadQwen3 } from '../../src/tokens/tokenizer.js';

// The segment cache must not keep the texts its pieces came from. A piece between added tokens is a slice of the
// rendered prompt, and V8 keeps a sliced string's whole parent alive: bench/soak found 72,050 rendered prompts
// (187 MiB) held that way by short cached pieces. Here: 300 unique 100 KB texts, each with short pieces between
// added tokens; what stays on the heap after a full collection must be the cache's own bounded copies.
setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

describe('the tokenizer segment cache', () => {
  it('keeps own copies of its keys, not the (large) texts they were cut from', async () => {
    const { tokenizer } = await loadQwen3();
    const text = (i: number): string => `<|im_start|>user\nquestion number ${i}, answer it please<|im_end|>\n<|im_start|>assistant\n${`filler ${i} `.repeat(10_000).slice(0, 100_000)}`;
    tokenizer.encode(text(-1));
    gc();
    const before = process.memoryUsage().heapUsed;
    for (let i = 0; i < 300; i++) tokenizer.encode(text(i));
    gc();
    const grown = process.memoryUsage().heapUsed - before;
    // 300 × 100 K characters is ≥ 30 MB of parent text (Latin-1, one byte each); the short pieces alone are a few KB.
    expect(grown).toBeLessThan(8 << 20);
  }, 120_000);

  it('detachedCopy keeps every code unit, lone surrogates included', () => {
    for (const t of ['', 'a', 'é😀', 'a\uD800b', '\uDC00', 'x'.repeat(1000).slice(3, 20)]) expect(detachedCopy(t)).toBe(t);
  });
});
