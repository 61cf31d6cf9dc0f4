import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EmbeddedEngineClient } from '../../src/backends/embedded/embedded-engine.js';
import { TINY_QWEN3_URL } from '../../src/backends/embedded/embedded-url.js';
import type { GenerateRequest, GenerateResult } from '../../src/backends/types.js';
import { RolloutError } from '../../src/errors.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';

// Review s44: the embedded engine run by several requests at once, as a rollout server runs it (a GRPO group's
// samples, each with its own seed, in the engine's sequences at the same time).

const signal = new AbortController().signal;
let engine: EmbeddedEngineClient;
let shortPrompt: number[];
let longPrompt: number[];
let vocabSize: number;

beforeAll(async () => {
  const { tokenizer } = await loadQwen3();
  vocabSize = tokenizer.vocabSize;
  shortPrompt = tokenizer.encode('<|im_start|>user\nWhat is 6 times 7?<|im_end|>\n<|im_start|>assistant\n');
  longPrompt = tokenizer.encode(`<|im_start|>user\n${'Tell me a long story about a cat. '.repeat(20)}<|im_end|>\n<|im_start|>assistant\n`);
  engine = new EmbeddedEngineClient({ url: `${TINY_QWEN3_URL}?threads=1&sequences=4&contextSize=1024` });
  await engine.ready();
}, 120_000);

afterAll(async () => {
  await engine?.closed();
});

const ask = (extra: Partial<GenerateRequest>): Promise<GenerateResult> =>
  engine.generate({ promptIds: shortPrompt, maxTokens: 64, temperature: 1, vocabSize, signal, ...extra });

describe('the embedded engine under concurrency', () => {
  // Regression: llama.cpp decoded the sequences of concurrent requests in one batch, and its CPU kernels round
  // differently for a batch of several rows than for one: the logprobs of a request run next to others differed from
  // its run alone within a few tokens, and its ids a few dozen tokens later (same seed, same prompt).
  it('gives each request the very ids and logprobs it gives alone, whatever runs next to it in the other sequences', async () => {
    const requests: Array<Partial<GenerateRequest>> = [
      { seed: 1 },
      { seed: 2 },
      { seed: 3, promptIds: longPrompt }, // a prompt being evaluated while the others sample
      { seed: 4, temperature: 0.7, topP: 0.9 },
    ];
    const alone: GenerateResult[] = [];
    for (const r of requests) alone.push(await ask(r));
    const together = await Promise.all(requests.map((r) => ask(r)));
    for (const [i, out] of together.entries()) {
      expect(out.tokenIds, `request ${i}: ids`).toEqual(alone[i]!.tokenIds);
      expect(out.logprobs, `request ${i}: logprobs`).toEqual(alone[i]!.logprobs);
    }
  }, 120_000);
});

describe('the embedded engine\u2019s sequences take turns', () => {
  // What the fix above must not cost: with one sequence per batch, a long prompt (evaluated in chunks of 512 tokens,
  // one per batch) first held back every other sequence until it was all in (the queue served its oldest entry).
  it('a long prompt being evaluated does not hold back the tokens of a request already generating', async () => {
    const { tokenizer } = await loadQwen3();
    const huge = tokenizer.encode(`<|im_start|>user\n${'Tell me a long story about a cat. '.repeat(380)}<|im_end|>\n<|im_start|>assistant\n`);
    expect(huge.length).toBeGreaterThan(6 * 512); // at least 7 batches
    const wide = new EmbeddedEngineClient({ url: `${TINY_QWEN3_URL}?threads=1&sequences=2&contextSize=4096` });
    try {
      await wide.ready();
      const tokensOf = (id: string): number => wide.generations().find((g) => g.requestId === id)?.tokens ?? Number.NaN;
      const running = wide.generate({ promptIds: shortPrompt, maxTokens: 2_000, temperature: 1, seed: 1, vocabSize, signal, requestId: 'running' });
      await expect.poll(() => tokensOf('running') >= 3, { timeout: 30_000 }).toBe(true);
      const before = tokensOf('running');
      await wide.generate({ promptIds: huge, maxTokens: 1, temperature: 1, seed: 2, vocabSize, signal, requestId: 'long' });
      const advanced = tokensOf('running') - before;
      await wide.abort(['running']);
      expect((await running).finishReason).toBe('abort');
      // Every other batch is the running request's token: about 6 while the 7 chunks go in (2 when it waited).
      expect(advanced).toBeGreaterThanOrEqual(4);
    } finally {
      await wide.closed();
    }
  }, 60_000);
});

describe('the embedded engine closed while its sequences generate', () => {
  // Regression: close() disposed the llama.cpp context under the running generations; the one whose next token was
  // queued for evaluation (the other sequence's batch being decoded) rejected with node-llama-cpp's own DisposedError
  // ("Object is disposed": no code, no engine named) instead of the backend_error every other request got.
  it('fails every request in flight, running or queued, with backend_error naming the engine; closed() does not hang', async () => {
    const closing = new EmbeddedEngineClient({ url: `${TINY_QWEN3_URL}?threads=1&sequences=2&contextSize=1024` });
    await closing.ready();
    const outcomes = [1, 2, 3].map((seed) =>
      closing.generate({ promptIds: shortPrompt, maxTokens: 900, temperature: 1, seed, vocabSize, signal }).then(
        (r) => r,
        (e: unknown) => e,
      ),
    );
    await expect.poll(() => closing.generations().length === 2 && closing.generations().every((g) => g.tokens >= 3), { timeout: 30_000 }).toBe(true);
    await closing.closed();
    for (const [i, outcome] of (await Promise.all(outcomes)).entries()) {
      expect(outcome, `request ${i}`).toBeInstanceOf(RolloutError);
      expect((outcome as RolloutError).code, `request ${i}`).toBe('backend_error');
      expect((outcome as RolloutError).message, `request ${i}`).toContain('embedded engine');
    }
  }, 60_000);
});
