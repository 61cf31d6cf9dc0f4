import { copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextOverflowError } from '../../src/backends/context-overflow.js';
import { EmbeddedEngineClient } from '../../src/backends/embedded/embedded-engine.js';
import { TINY_QWEN3_URL } from '../../src/backends/embedded/embedded-url.js';
import { ensureTinyQwen3Gguf } from '../../src/backends/embedded/tiny-qwen3.js';
import type { GenerateRequest } from '../../src/backends/types.js';
import { RolloutError } from '../../src/errors.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { eventually } from '../support/wait.js';

const signal = new AbortController().signal;
let engine: EmbeddedEngineClient;
let promptIds: number[];
let vocabSize: number;

beforeAll(async () => {
  const { tokenizer } = await loadQwen3();
  vocabSize = tokenizer.vocabSize;
  promptIds = tokenizer.encode('<|im_start|>user\nWhat is 6 times 7?<|im_end|>\n<|im_start|>assistant\n');
  engine = new EmbeddedEngineClient({ url: `${TINY_QWEN3_URL}?threads=1&sequences=2` });
  const started = performance.now();
  await engine.ready();
  console.log(`embedded engine: tiny Qwen3 written (if not cached) and loaded in ${Math.round(performance.now() - started)} ms`);
}, 120_000);

afterAll(async () => {
  await engine?.closed();
});

const ask = (extra: Partial<GenerateRequest> = {}): Promise<Awaited<ReturnType<EmbeddedEngineClient['generate']>>> =>
  engine.generate({ promptIds, maxTokens: 32, temperature: 1, seed: 11, vocabSize, signal, ...extra });

describe('the embedded llama.cpp engine', () => {
  it('samples ids in the vocabulary with one logprob <= 0 per token and stops at max_tokens with length', async () => {
    const started = performance.now();
    const out = await ask({ maxTokens: 64 });
    console.log(`embedded engine: 64 tokens in ${Math.round(performance.now() - started)} ms`);
    expect(out.tokenIds).toHaveLength(64);
    expect(out.logprobs).toHaveLength(64);
    expect(out.finishReason).toBe('length');
    for (const id of out.tokenIds) expect(Number.isInteger(id) && id >= 0 && id < vocabSize).toBe(true);
    for (const p of out.logprobs) expect(Number.isFinite(p) && p <= 0).toBe(true);
    expect(out.text.length).toBeGreaterThan(0);
  });

  it('gives the same ids and logprobs for the same seed and prompt, other ids for another seed', async () => {
    const a = await ask();
    const b = await ask();
    const c = await ask({ seed: 12 });
    expect(b.tokenIds).toEqual(a.tokenIds);
    expect(b.logprobs).toEqual(a.logprobs);
    expect(c.tokenIds).not.toEqual(a.tokenIds);
  });

  it('is reproducible for seeds whose low 32 bits are llama.cpp\u2019s "random seed" (-1, 2^32 - 1)', async () => {
    for (const seed of [-1, 2 ** 32 - 1]) {
      const a = await ask({ maxTokens: 24, seed });
      const b = await ask({ maxTokens: 24, seed });
      expect(b.tokenIds, `seed ${seed}`).toEqual(a.tokenIds);
    }
  });

  it('reports logprobs under the sampling distribution: top_k 1 leaves one candidate, so every logprob is 0', async () => {
    const free = await ask({ maxTokens: 16 });
    const topOne = await ask({ maxTokens: 16, topK: 1 });
    expect(topOne.logprobs.every((p) => p === 0)).toBe(true);
    expect(free.logprobs.some((p) => p < -1e-3)).toBe(true);
    // Colder sampling concentrates the distribution: the sampled tokens become likelier.
    const cold = await ask({ maxTokens: 16, temperature: 0.05 });
    const mean = (xs: number[]): number => xs.reduce((s, x) => s + x, 0) / xs.length;
    expect(mean(cold.logprobs)).toBeGreaterThan(mean(free.logprobs));
  });

  it('ends at a stop string with finish_reason stop: ids through the completing token, text cut before it', async () => {
    const free = await ask({ maxTokens: 24 });
    // A piece of what this seed writes, taken from the decoded text of tokens 5..7, becomes the stop string.
    const { tokenizer } = await loadQwen3();
    const before = tokenizer.decode(free.tokenIds.slice(0, 5));
    const piece = tokenizer.decode(free.tokenIds.slice(0, 8)).slice(before.length).trim().slice(0, 4);
    expect(piece.length).toBeGreaterThan(0);
    const stopped = await ask({ maxTokens: 24, stop: [piece] });
    expect(stopped.finishReason).toBe('stop');
    expect(stopped.tokenIds.length).toBeLessThanOrEqual(8);
    expect(stopped.tokenIds).toEqual(free.tokenIds.slice(0, stopped.tokenIds.length));
    expect(stopped.text.includes(piece)).toBe(false);
    expect(free.text.startsWith(stopped.text)).toBe(true);
  });

  it('ends at a requested stop token id (stop_token_ids) with finish stop, the id kept as the last', async () => {
    const whole = await ask({ maxTokens: 16 });
    // The seed fixes the ids: asked again with the fifth sampled id as a stop id, the answer ends at its first place.
    const stopId = whole.tokenIds[4]!;
    const at = whole.tokenIds.indexOf(stopId);
    const out = await ask({ maxTokens: 16, stopTokenIds: [stopId] });
    expect(out.finishReason).toBe('stop');
    expect(out.tokenIds).toEqual(whole.tokenIds.slice(0, at + 1));
    expect(out.logprobs).toEqual(whole.logprobs.slice(0, at + 1));
  });

  it('stops mid-generation when the signal aborts, with the abort reason', async () => {
    const controller = new AbortController();
    const started = performance.now();
    const pending = ask({ maxTokens: 2_000, signal: controller.signal });
    setTimeout(() => controller.abort(new RolloutError('cancelled', 'trajectory cancelled')), 200);
    const err = await pending.then(
      () => undefined,
      (e: unknown) => e,
    );
    const elapsed = performance.now() - started;
    expect(err).toBeInstanceOf(RolloutError);
    expect((err as RolloutError).code).toBe('cancelled');
    expect(elapsed).toBeLessThan(5_000); // 2,000 tokens take far longer; the abort lands within a token or two
    // The sequence went back to the pool: the engine still serves.
    expect((await ask({ maxTokens: 4 })).tokenIds).toHaveLength(4);
  });

  it('keeps the event loop responsive while generating (inference runs on native threads)', async () => {
    const histogram = monitorEventLoopDelay({ resolution: 5 });
    histogram.enable();
    const out = await Promise.all([ask({ maxTokens: 96, seed: 1 }), ask({ maxTokens: 96, seed: 2 })]);
    histogram.disable();
    const p99 = histogram.percentile(99) / 1e6;
    const max = histogram.max / 1e6;
    console.log(`embedded engine: event-loop delay during 2×96 tokens: p50 ${(histogram.percentile(50) / 1e6).toFixed(1)} ms, p99 ${p99.toFixed(1)} ms, max ${max.toFixed(1)} ms`);
    expect(out.every((o) => o.tokenIds.length === 96)).toBe(true);
    expect(p99).toBeLessThan(50);
  });

  it('queues requests beyond its sequences and answers them all', async () => {
    const outs = await Promise.all([1, 2, 3, 4, 5].map((seed) => ask({ maxTokens: 8, seed })));
    expect(outs.map((o) => o.tokenIds.length)).toEqual([8, 8, 8, 8, 8]);
    // Reproducible under concurrency too: each equals its own run alone.
    expect((await ask({ maxTokens: 8, seed: 3 })).tokenIds).toEqual(outs[2]!.tokenIds);
  });

  it('refuses a prompt plus max_tokens beyond its context as a context overflow, and reports the context size', async () => {
    const info = await engine.modelInfo();
    expect(info.maxModelLen).toBeGreaterThanOrEqual(4096);
    const err = await ask({ maxTokens: info.maxModelLen! }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ContextOverflowError);
    expect((err as ContextOverflowError).maxModelLen).toBe(info.maxModelLen);
  });

  it('refuses max_tokens below 1 itself, naming it, instead of answering an empty completion', async () => {
    for (const maxTokens of [0, -5, 1.5]) {
      const err = await ask({ maxTokens }).catch((e: unknown) => e);
      expect(err, `max_tokens ${maxTokens}`).toBeInstanceOf(RolloutError);
      expect((err as RolloutError).message).toContain(`max_tokens must be a positive integer, not ${maxTokens}`);
    }
    expect((await ask({ maxTokens: 1 })).tokenIds).toHaveLength(1); // the sequence was not taken by a refusal
  });

  it('is healthy while loaded and not after close', async () => {
    const other = new EmbeddedEngineClient({ url: `${TINY_QWEN3_URL}?threads=1&sequences=1&contextSize=512` });
    expect(await other.health(signal)).toBe(true);
    await other.closed();
    expect(await other.health(signal)).toBe(false);
    await expect(other.generate({ promptIds, maxTokens: 4, signal })).rejects.toMatchObject({ code: 'backend_error' });
  });
});

describe('an embedded engine whose GGUF is not there when it is created', () => {
  // Regression: the model loaded once, in the constructor; a failed load stayed failed until the server restarted.
  it('loads it once the file is there (the copy finished, the mount came up): health turns true, requests are served', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'embedded-late-'));
    const path = join(dir, 'late.gguf');
    const late = new EmbeddedEngineClient({ url: `file://${path}?threads=1&sequences=1&contextSize=512` });
    try {
      expect(await late.health(AbortSignal.timeout(5_000))).toBe(false);
      await expect(late.generate({ promptIds, maxTokens: 2, signal })).rejects.toMatchObject({ code: 'backend_error', message: expect.stringContaining(`cannot load ${path}`) });
      copyFileSync(await ensureTinyQwen3Gguf(), path);
      // Asked again (as the pool's health probes do) once its backoff (1 s, then 2, 4, ...) has passed.
      await eventually(() => late.health(AbortSignal.timeout(5_000)), 'the late model to load', 30_000);
      expect((await late.generate({ promptIds, maxTokens: 2, seed: 1, vocabSize, signal })).tokenIds).toHaveLength(2);
    } finally {
      await late.closed();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});

describe('the embedded engine\u2019s control: abort by id, pause in three modes, resume (as vLLM\u2019s dev-mode routes)', () => {
  const settledFlag = <T>(p: Promise<T>): { settled: () => boolean } => {
    let done = false;
    void p.finally(() => (done = true)).catch(() => undefined);
    return { settled: () => done };
  };
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
  /** Until the generation with this id (or any) has sampled at least `tokens` tokens. */
  const sampling = (tokens: number, requestId?: string) =>
    expect.poll(() => engine.generations().some((g) => (requestId === undefined || g.requestId === requestId) && g.tokens >= tokens), { timeout: 30_000 }).toBe(true);

  it('abort by request id ends that generation with finish "abort" and the seeded prefix it had sampled; the other goes on', async () => {
    const victim = ask({ maxTokens: 2_000, seed: 21, requestId: 'victim' });
    const other = ask({ maxTokens: 24, seed: 22, requestId: 'other' });
    await sampling(3, 'victim');
    await engine.abort(['victim', 'unknown']);
    const aborted = await victim;
    expect(aborted.finishReason).toBe('abort');
    expect(aborted.tokenIds.length).toBeGreaterThan(0);
    expect(aborted.tokenIds.length).toBeLessThan(2_000);
    expect(aborted.logprobs).toHaveLength(aborted.tokenIds.length);
    expect((await other).tokenIds).toHaveLength(24);
    const again = await ask({ maxTokens: aborted.tokenIds.length, seed: 21 });
    expect(again.tokenIds).toEqual(aborted.tokenIds);
  });

  it('pause abort: running generations end "abort"; requests sent while paused wait for resume', async () => {
    const running = ask({ maxTokens: 2_000, seed: 23 });
    await sampling(3);
    await engine.pause('abort', signal);
    expect((await running).finishReason).toBe('abort');
    const waiting = ask({ maxTokens: 4, seed: 24 });
    const flag = settledFlag(waiting);
    await sleep(300);
    expect(flag.settled()).toBe(false);
    await engine.resume();
    expect((await waiting).tokenIds).toHaveLength(4);
  });

  it('pause wait resolves only once running generations have finished, unaborted', async () => {
    const running = ask({ maxTokens: 64, seed: 25 });
    await sampling(1);
    await engine.pause('wait', signal);
    const flag = settledFlag(running);
    await sleep(0);
    expect(flag.settled()).toBe(true);
    expect((await running).finishReason).toBe('length');
    await engine.resume();
  });

  it('pause keep freezes a generation between two tokens and resume continues it to the very answer it would have given', async () => {
    const reference = await ask({ maxTokens: 160, seed: 26 });
    const running = ask({ maxTokens: 160, seed: 26 });
    const flag = settledFlag(running);
    await sampling(3);
    await engine.pause('keep', signal);
    const frozenAt = engine.generations()[0]!.tokens;
    await sleep(500);
    expect(flag.settled()).toBe(false);
    expect(engine.generations()[0]!.tokens).toBe(frozenAt);
    await engine.resume();
    expect(await running).toEqual(reference);
  });
});

