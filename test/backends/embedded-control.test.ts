import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EmbeddedEngineClient } from '../../src/backends/embedded/embedded-engine.js';
import { TINY_QWEN3_URL } from '../../src/backends/embedded/embedded-url.js';
import type { GenerateRequest, GenerateResult } from '../../src/backends/types.js';
import { RolloutError } from '../../src/errors.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';

// Regression tests for the embedded engine's control at its edges: requests that have no sequence yet (waiting for
// the model, at the pause gate, for a sequence), pauses that follow each other, and close() under a pause. One
// sequence, so a second request always waits for it.

const signal = new AbortController().signal;
let engine: EmbeddedEngineClient;
let promptIds: number[];
let vocabSize: number;

beforeAll(async () => {
  const { tokenizer } = await loadQwen3();
  vocabSize = tokenizer.vocabSize;
  promptIds = tokenizer.encode('<|im_start|>user\nWhat is 6 times 7?<|im_end|>\n<|im_start|>assistant\n');
  engine = new EmbeddedEngineClient({ url: `${TINY_QWEN3_URL}?threads=1&sequences=1&contextSize=1024` });
  await engine.ready();
}, 120_000);

afterAll(async () => {
  await engine?.closed();
});

const ask = (e: EmbeddedEngineClient, extra: Partial<GenerateRequest> = {}): Promise<GenerateResult> =>
  e.generate({ promptIds, maxTokens: 32, temperature: 1, seed: 11, vocabSize, signal, ...extra });

/** What a request aborted before it had a sequence answers: finish "abort" with the tokens sampled so far, none. */
const abortedUnstarted: GenerateResult = { tokenIds: [], logprobs: [], finishReason: 'abort', text: '' };

/** Settles with 'pending' if `p` has not settled within `ms`, with `{ rejected }` if it rejected. */
const within = <T>(p: Promise<T>, ms: number): Promise<T | 'pending' | { rejected: unknown }> =>
  Promise.race([p.then((v) => v, (e: unknown) => ({ rejected: e })), new Promise<'pending'>((resolve) => setTimeout(() => resolve('pending'), ms))]);

const settledFlag = <T>(p: Promise<T>): { settled: () => boolean } => {
  let done = false;
  void p.finally(() => (done = true)).catch(() => undefined);
  return { settled: () => done };
};
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
/** Until a generation of `e` with this id (or any) has sampled at least `tokens` tokens. */
const sampling = (e: EmbeddedEngineClient, tokens: number, requestId?: string) =>
  expect.poll(() => e.generations().some((g) => (requestId === undefined || g.requestId === requestId) && g.tokens >= tokens), { timeout: 30_000 }).toBe(true);

describe('the embedded engine\u2019s abort reaches requests that have no sequence yet', () => {
  it('abort by id ends a request waiting for a sequence at once, answering "abort" with no tokens; the running one goes on', async () => {
    const long = ask(engine, { maxTokens: 1_000, requestId: 'long', seed: 1 });
    const queued = ask(engine, { maxTokens: 48, requestId: 'queued', seed: 2 });
    await sampling(engine, 2, 'long');
    await engine.abort(['queued', 'unknown']);
    expect(await within(queued, 3_000)).toEqual(abortedUnstarted);
    expect(engine.generations().map((g) => g.requestId)).toEqual(['long']);
    await engine.abort(['long']);
    const out = await long;
    expect(out.finishReason).toBe('abort');
    expect(out.tokenIds.length).toBeGreaterThan(0);
  });

  it('abort by id and abort-all end requests held at the pause gate; resume lets later ones through', async () => {
    await engine.pause('wait', signal); // nothing runs: holds at once
    const first = ask(engine, { requestId: 'held-1' });
    const second = ask(engine, { requestId: 'held-2' });
    const anonymous = ask(engine);
    const flags = [settledFlag(second), settledFlag(anonymous)];
    await sleep(50);
    await engine.abort(['held-1', 'unknown']);
    expect(await within(first, 3_000)).toEqual(abortedUnstarted);
    expect(flags.map((f) => f.settled())).toEqual([false, false]);
    await engine.abort(undefined);
    expect(await within(Promise.all([second, anonymous]), 3_000)).toEqual([abortedUnstarted, abortedUnstarted]);
    await engine.resume();
    expect((await ask(engine, { maxTokens: 4 })).tokenIds).toHaveLength(4);
  });

  it('an abort-mode pause also ends the requests queued for a sequence, so it does not wait for them (max concurrency above the sequences)', async () => {
    const running = ask(engine, { maxTokens: 1_000, seed: 3 });
    const queued = ask(engine, { maxTokens: 1_000, seed: 4 });
    await sampling(engine, 2);
    await engine.pause('abort', signal);
    expect(await within(Promise.all([running, queued]), 3_000)).toMatchObject([{ finishReason: 'abort' }, abortedUnstarted]);
    await engine.resume();
    expect((await ask(engine, { maxTokens: 4 })).tokenIds).toHaveLength(4);
  });
});

describe('the embedded engine\u2019s pauses in sequence', () => {
  it('a wait pause after a keep pause lets the frozen generation finish, then holds', async () => {
    const reference = await ask(engine, { maxTokens: 160, seed: 26 });
    const running = ask(engine, { maxTokens: 160, seed: 26 });
    await sampling(engine, 2);
    await engine.pause('keep', signal);
    const flag = settledFlag(running);
    await sleep(100);
    expect(flag.settled()).toBe(false);
    expect(await within(engine.pause('wait', signal), 30_000)).toBeUndefined();
    expect(flag.settled()).toBe(true);
    expect(await running).toEqual(reference);
    const held = settledFlag(ask(engine, { maxTokens: 4 }));
    await sleep(100);
    expect(held.settled()).toBe(false);
    await engine.resume();
    await expect.poll(held.settled, { timeout: 30_000 }).toBe(true);
  });
});

describe('an engine still loading, then closed under a pause', () => {
  let other: EmbeddedEngineClient;
  beforeAll(() => {
    other = new EmbeddedEngineClient({ url: `${TINY_QWEN3_URL}?threads=1&sequences=1&contextSize=512` });
  });
  afterAll(async () => {
    await other?.closed();
  });

  it('health, modelInfo and a request honour their signal (and an abort by id) while the model loads', async () => {
    const early = ask(other, { requestId: 'early' });
    const started = performance.now();
    expect(await other.health(AbortSignal.timeout(5))).toBe(false);
    const err = await other.modelInfo(AbortSignal.timeout(5)).catch((e: unknown) => e);
    // Well under the load (seconds), whatever else the machine runs.
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(err).toBeInstanceOf(RolloutError);
    expect((err as RolloutError).code).toBe('deadline_exceeded');
    await other.abort(['early']);
    expect(await within(early, 1_000)).toEqual(abortedUnstarted);
    await other.ready();
    expect(await other.health(AbortSignal.timeout(1_000))).toBe(true);
    expect((await other.modelInfo(AbortSignal.timeout(1_000))).maxModelLen).toBe(512);
  });

  it('close() fails a generation frozen by a keep pause and a request held by it with backend_error', async () => {
    const frozen = ask(other, { maxTokens: 400, seed: 5 });
    await sampling(other, 2);
    await other.pause('keep', signal);
    const held = ask(other, { maxTokens: 4 });
    await sleep(50);
    const outcomes = Promise.all([within(frozen, 10_000), within(held, 10_000)]); // observed before they settle
    await other.closed();
    expect(await outcomes).toMatchObject([{ rejected: { code: 'backend_error' } }, { rejected: { code: 'backend_error' } }]);
  });
});
