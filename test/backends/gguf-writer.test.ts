import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readGgufFileInfo, type Token } from 'node-llama-cpp';
import { afterAll, describe, expect, it } from 'vitest';
import { loadLlamaRuntime } from '../../src/backends/embedded/llama-runtime.js';
import { toFloat16Bits, writeGguf } from '../../src/backends/embedded/gguf-writer.js';
import { DEFAULT_TINY_QWEN3, ensureTinyQwen3Gguf, writeTinyQwen3Gguf } from '../../src/backends/embedded/tiny-qwen3.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';

const dir = mkdtempSync(join(tmpdir(), 'gguf-writer-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('the GGUF writer', () => {
  it('converts floats to IEEE half precision, subnormals and overflow included', () => {
    expect(toFloat16Bits(1)).toBe(0x3c00);
    expect(toFloat16Bits(-2)).toBe(0xc000);
    expect(toFloat16Bits(65504)).toBe(0x7bff);
    expect(toFloat16Bits(1e6)).toBe(0x7c00);
    expect(toFloat16Bits(0.1)).toBe(0x2e66);
    expect(toFloat16Bits(1e-7)).toBe(0x0002); // 1e-7 / 2^-24 ≈ 1.68 → 2 subnormal steps
    expect(toFloat16Bits(0)).toBe(0);
  });

  it('round-trips metadata and tensor infos through node-llama-cpp’s GGUF reader', async () => {
    const path = join(dir, 'small.gguf');
    writeGguf(
      path,
      new Map([
        ['general.architecture', { type: 'string', value: 'llama' }],
        ['general.name', { type: 'string', value: 'round trip ✓' }],
        ['llama.context_length', { type: 'u32', value: 4096 }],
        ['llama.attention.layer_norm_rms_epsilon', { type: 'f32', value: 0.5 }],
        ['tokenizer.ggml.add_bos_token', { type: 'bool', value: true }],
        ['tokenizer.ggml.tokens', { type: 'string[]', value: ['a', 'b', 'ç'] }],
        ['tokenizer.ggml.token_type', { type: 'i32[]', value: [1, 3, 4] }],
      ]),
      [
        { name: 'w', dims: [3, 2], data: Float32Array.from([1, 2, 3, 4, 5, 6]), f16: true },
        { name: 'n', dims: [5], data: new Float32Array(5).fill(1) },
      ],
    );
    const info = await readGgufFileInfo(path, { logWarnings: false });
    expect(info.version).toBe(3);
    const meta = info.metadata as unknown as Record<string, Record<string, unknown>>;
    expect(meta.general).toMatchObject({ architecture: 'llama', name: 'round trip ✓', alignment: 32 });
    expect(meta.llama).toMatchObject({ context_length: 4096, attention: { layer_norm_rms_epsilon: 0.5 } });
    expect(meta.tokenizer).toMatchObject({ ggml: { add_bos_token: true, tokens: ['a', 'b', 'ç'], token_type: [1, 3, 4] } });
    expect(info.tensorInfo?.map((t) => [t.name, t.dimensions.map(Number), t.ggmlType, Number(t.offset)])).toEqual([
      ['w', [3, 2], 1, 0],
      ['n', [5], 0, 32], // 12 bytes of F16 padded to the 32-byte alignment
    ]);
  });
});

describe('the tiny random-weight Qwen3', () => {
  it('is deterministic: the same shape and seed give the same bytes, another seed other weights', async () => {
    const sha = (p: string): string => createHash('sha256').update(readFileSync(p)).digest('hex');
    const a = join(dir, 'a.gguf');
    const started = performance.now();
    writeTinyQwen3Gguf(a);
    console.log(`tiny Qwen3 GGUF written in ${Math.round(performance.now() - started)} ms`);
    const b = join(dir, 'b.gguf');
    writeTinyQwen3Gguf(b);
    expect(sha(b)).toBe(sha(a));
    const c = join(dir, 'c.gguf');
    writeTinyQwen3Gguf(c, { ...DEFAULT_TINY_QWEN3, seed: 2 });
    expect(sha(c)).not.toBe(sha(a));
    expect(await ensureTinyQwen3Gguf()).toBe(await ensureTinyQwen3Gguf()); // one cached file per shape
  });

  it('is written off the event loop the first time: timers keep firing while ~19 MB are generated and written', async () => {
    const cache = join(dir, 'fresh-cache');
    let last = performance.now();
    let longest = 0;
    const ticker = setInterval(() => {
      const now = performance.now();
      longest = Math.max(longest, now - last);
      last = now;
    }, 5);
    let path: string;
    try {
      path = await ensureTinyQwen3Gguf(DEFAULT_TINY_QWEN3, cache);
      // One more tick: a write that blocked the loop shows as the gap this tick measures.
      await new Promise((resolve) => setTimeout(resolve, 20));
    } finally {
      clearInterval(ticker);
    }
    console.log(`tiny Qwen3 GGUF written to a fresh cache; longest event-loop gap ${Math.round(longest)} ms`);
    expect(longest).toBeLessThan(250);
    expect(readFileSync(path).equals(readFileSync(await ensureTinyQwen3Gguf()))).toBe(true); // the same bytes as the sync writer's
  });

  it('loads in llama.cpp as qwen3 with the real Qwen3 vocabulary: metadata and tokenization match the tokenizer', async () => {
    const path = await ensureTinyQwen3Gguf();
    const { tokenizer } = await loadQwen3();
    const info = await readGgufFileInfo(path, { logWarnings: false });
    const meta = info.metadata as unknown as Record<string, Record<string, unknown>>;
    expect(meta.general).toMatchObject({ architecture: 'qwen3' });
    expect(meta.qwen3).toMatchObject({ embedding_length: 64, block_count: 2, context_length: DEFAULT_TINY_QWEN3.contextLength });
    const ggml = meta.tokenizer!.ggml as Record<string, unknown>;
    expect(ggml).toMatchObject({ model: 'gpt2', pre: 'qwen2', eos_token_id: tokenizer.tokenId('<|im_end|>') });
    expect((ggml.tokens as string[]).length).toBe(tokenizer.vocabSize);

    const llama = await loadLlamaRuntime();
    const started = performance.now();
    const model = await llama.loadModel({ modelPath: path, gpuLayers: 0 });
    console.log(`tiny Qwen3 GGUF loaded in ${Math.round(performance.now() - started)} ms`);
    try {
      const text = '<|im_start|>user\nHow many r’s in "strawberry"? Ünïcödé, 数学, <tool_call>{"x": 1}</tool_call> 12345<|im_end|>\n';
      expect([...model.tokenize(text, true)].map(Number)).toEqual(tokenizer.encode(text));
      const ids = tokenizer.encode(' hello world\n\tfoo');
      expect(model.detokenize(ids as Token[], true)).toBe(' hello world\n\tfoo');
      expect(model.isEogToken(tokenizer.tokenId('<|im_end|>') as Token)).toBe(true);
    } finally {
      await model.dispose();
    }
  });
});
