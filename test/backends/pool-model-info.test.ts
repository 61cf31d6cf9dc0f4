import { describe, expect, it } from 'vitest';
import { ModelNotServedError } from '../../src/backends/engine-http.js';
import { SglangClient } from '../../src/backends/sglang-client.js';
import type { EngineModelInfo, EngineServerInfo, GenerateRequest, GenerateResult } from '../../src/backends/types.js';
import { toBackend } from '../../src/contract/backend-service.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { RolloutError } from '../../src/errors.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { defaultResult, InMemoryEngineClient, type InMemoryEngineOptions } from '../../src/testing/in-memory-engine.js';
import { poolSuite } from '../support/pool-suite.js';

/**
 * What the pool learns from an engine about its model — its max_model_len, whether it serves the backend's model at
 * all — and when it asks again: after the engine was down (a restart), and after an answer cut short of a limit the
 * engine should not have reached.
 */

const suite = poolSuite({ pool: { acquireTimeoutMs: 1_000, healthFailureThreshold: 1 }, question: 'What is 6 * 7?' });

/**
 * TEST DOUBLE: an in-memory engine that also answers the model-card question (EngineClient.modelInfo, what GET
 * /v1/models says) as the test sets it — a limit, none, another model (ModelNotServedError), no answer (it throws) —
 * and counts how often it is asked.
 */
class ModelCardEngineDouble extends InMemoryEngineClient {
  asked = 0;

  constructor(
    public card: () => Promise<EngineModelInfo>,
    options: InMemoryEngineOptions = {},
  ) {
    super(options);
  }

  modelInfo(): Promise<EngineModelInfo> {
    this.asked++;
    return this.card();
  }
}

const limit = (maxModelLen: number | undefined) => (): Promise<EngineModelInfo> => Promise.resolve(maxModelLen === undefined ? {} : { maxModelLen });
const unreachable = (): Promise<EngineModelInfo> => Promise.reject(new RolloutError('backend_error', 'connection refused'));
const signal = (): AbortSignal => new AbortController().signal;
/** An answer of `n` sampled tokens that ended "length". */
const cutAfter = (n: number) => (): GenerateResult => defaultResult({ tokenIds: Array.from({ length: n }, (_, i) => 100 + i), logprobs: Array.from({ length: n }, () => -0.5), finishReason: 'length' });

async function generateOnce(pool: ReturnType<typeof suite.makePool>, request: Omit<GenerateRequest, 'signal'>): Promise<GenerateResult> {
  const lease = await pool.acquire('t/0');
  try {
    return await lease.generate({ ...request, signal: signal() });
  } finally {
    lease.release();
  }
}

describe('BackendPool asks an engine about itself again when it may have changed', () => {
  // Regression: max_model_len was learned only when added, so an engine restarted with a larger one stayed sized to the old.
  it('an engine back after it was down is asked again: a restart with a larger max_model_len and capacity is used', async () => {
    const pool = suite.makePool();
    let maxModelLen = 300;
    let maxNumSeqs = 2;
    const engine = new ModelCardEngineDouble(() => Promise.resolve({ maxModelLen }), {
      serverInfo: () => Promise.resolve({ maxConcurrency: maxNumSeqs }),
      respond: () => defaultResult(),
    });
    pool.add(engine, { id: 'e', model: 'm' });
    expect(await pool.learn('e')).toMatchObject({ maxModelLen: 300, maxConcurrency: 2, capacitySource: 'engine' });

    // The restart: down, then up with --max-model-len 40960 --max-num-seqs 8.
    engine.healthy = false;
    await pool.probeHealth();
    expect(pool.list()[0]!.healthy).toBe(false);
    maxModelLen = 40960;
    maxNumSeqs = 8;
    engine.healthy = true;
    await pool.probeHealth();
    await expect.poll(() => pool.list()[0]).toMatchObject({ healthy: true, maxModelLen: 40960, maxConcurrency: 8, capacitySource: 'engine' });

    await generateOnce(pool, { promptIds: suite.prompt, maxTokens: 1000 });
    expect(engine.calls.at(-1)!.maxTokens).toBe(1000);
  });

  it('keeps what it learned until the engine answers again, and never asks a limit that was configured', async () => {
    const pool = suite.makePool();
    const learned = new ModelCardEngineDouble(limit(300), { url: 'memory://learned' });
    const configured = new ModelCardEngineDouble(limit(300), { url: 'memory://configured' });
    pool.add(learned, { id: 'learned', model: 'm' });
    pool.add(configured, { id: 'configured', model: 'm', maxModelLen: 500 });
    await pool.learn('learned');
    for (const engine of [learned, configured]) engine.healthy = false;
    await pool.probeHealth();
    // Back, but its card cannot be read yet: the limit it stated before stays in use, and it is asked at the next probe.
    learned.card = unreachable;
    for (const engine of [learned, configured]) engine.healthy = true;
    await pool.probeHealth();
    await pool.learn('learned');
    expect(pool.list().map((b) => [b.id, b.healthy, b.maxModelLen])).toEqual([['learned', true, 300], ['configured', true, 500]]);
    learned.card = limit(2048);
    await pool.probeHealth();
    await pool.learn('learned');
    expect(pool.list().map((b) => [b.id, b.maxModelLen])).toEqual([['learned', 2048], ['configured', 500]]);
    expect(configured.asked).toBe(0);
  });
});

describe('an answer the engine cut short ("length" with fewer tokens than max_tokens)', () => {
  it('is the end of the context when prompt + sampled reach the limit the pool knows (or a token or two before: SGLang)', async () => {
    const pool = suite.makePool();
    const prompt = Array.from({ length: 290 }, (_, i) => i + 1);
    for (const sampled of [10, 9, 8]) {
      const engine = new ModelCardEngineDouble(limit(300), { respond: cutAfter(sampled) });
      pool.add(engine, { id: `e${sampled}`, model: 'm' });
      await pool.learn(`e${sampled}`);
      // The lease lowers max_tokens 64 to the 10 tokens of room; the engine ends at 300, 299 or 298.
      expect((await generateOnce(pool, { promptIds: prompt, maxTokens: 64 })).tokenIds).toHaveLength(sampled);
      expect(engine.calls.at(-1)!.maxTokens).toBe(10);
      await pool.remove(`e${sampled}`, { drain: false });
    }
  });

  // Regression: "length" after 3 of 256 tokens, ~40,000 short of the known limit, was read as a full context (max_model_len).
  it('far from a limit the engine still states: the engine is asked again, then the answer is refused as backend_error', async () => {
    const pool = suite.makePool();
    const engine = new ModelCardEngineDouble(limit(40960), { respond: cutAfter(3) });
    pool.add(engine, { id: 'e', model: 'm' });
    await pool.learn('e');
    const asked = engine.asked;
    const err = await generateOnce(pool, { promptIds: suite.prompt, maxTokens: 256 }).then(
      () => expect.fail('expected a refusal'),
      (e: unknown) => e as RolloutError,
    );
    expect(err).toBeInstanceOf(RolloutError);
    expect(err.code).toBe('backend_error');
    expect(err.message).toMatch(/finish_reason "length" after 3 of 256 max_tokens with a \d+-token prompt: \d+ tokens, far from its max_model_len 40960/);
    expect(engine.asked).toBeGreaterThan(asked);
  });

  it('from an engine restarted with a smaller limit the probes did not see: the pool learns it, and the answer stands', async () => {
    const pool = suite.makePool();
    const engine = new ModelCardEngineDouble(limit(40960), { respond: cutAfter(3) });
    pool.add(engine, { id: 'e', model: 'm' });
    await pool.learn('e');
    // vLLM >= 0.3x shortens max_tokens to what its (new, smaller) context leaves instead of refusing the request.
    engine.card = limit(suite.prompt.length + 3);
    expect((await generateOnce(pool, { promptIds: suite.prompt, maxTokens: 256 })).tokenIds).toHaveLength(3);
    expect(pool.list()[0]!.maxModelLen).toBe(suite.prompt.length + 3);
  });

  it('from an engine that states no limit: nothing contradicts it, it stays the engine\u2019s cut', async () => {
    const pool = suite.makePool();
    pool.add(new ModelCardEngineDouble(limit(undefined), { respond: cutAfter(3) }), { id: 'e', model: 'm' });
    expect((await generateOnce(pool, { promptIds: suite.prompt, maxTokens: 256 })).finishReason).toBe('length');
    expect(pool.list()[0]!.maxModelLen).toBeUndefined();
  });
});

describe('an engine that does not serve the backend\u2019s model', () => {
  // Regression: vLLM took "the only card" of an engine serving another model: added with its length, then 404 on every request.
  it('is refused for vLLM (invalid_argument, field model, naming what it serves), not for SGLang (its /generate takes no model)', async () => {
    const pool = suite.makePool();
    const vllm = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, model: 'other-model', maxModelLen: 1234 }));
    const sglang = suite.track(await FakeSglangEngine.start({ tokenizer: suite.tokenizer, model: 'other-model', contextLength: 1234 }));
    pool.add(new VllmClient({ url: vllm.url, model: 'policy' }), { id: 'vllm', model: 'policy' });
    pool.add(new SglangClient({ url: sglang.url, model: 'policy' }), { id: 'sglang', model: 'policy' });
    await Promise.all([pool.learn('vllm'), pool.learn('sglang')]);
    const refusal = (() => {
      try {
        pool.checkEngineAgrees('vllm');
      } catch (err) {
        return err;
      }
      return undefined;
    })();
    expect(refusal).toBeInstanceOf(ModelNotServedError);
    expect(refusal).toMatchObject({ code: 'invalid_argument', field: 'model' });
    expect((refusal as Error).message).toBe(`model: vLLM ${vllm.url} does not serve model "policy" (GET /v1/models: it serves "other-model")`);
    expect(() => pool.checkEngineAgrees('sglang')).not.toThrow();
    expect(pool.list().map((b) => [b.id, b.maxModelLen])).toEqual([['vllm', undefined], ['sglang', 1233]]);
  });

  it('found so once it answers (it was down when added), it takes no trajectory, and those on it move, until it serves the model', async () => {
    const pool = suite.makePool();
    const late = new ModelCardEngineDouble(unreachable, { url: 'memory://late', respond: () => defaultResult() });
    const good = new ModelCardEngineDouble(limit(4096), { url: 'memory://good', respond: () => defaultResult() });
    pool.add(late, { id: 'late', model: 'm' });
    await pool.learn('late');
    const pinned = await pool.acquire('pinned/0');
    expect(pinned.backendId).toBe('late');
    pool.add(good, { id: 'good', model: 'm' });
    await pool.learn('good');

    late.card = () => Promise.reject(new ModelNotServedError('vLLM memory://late does not serve model "m" (GET /v1/models: it serves "other")'));
    await pool.probeHealth();
    await pool.learn('late');
    expect(() => pool.checkEngineAgrees('late')).toThrow(ModelNotServedError);
    const fresh = await Promise.all([pool.acquire('a/0'), pool.acquire('b/0'), pool.acquire('c/0')]);
    expect(fresh.map((l) => l.backendId)).toEqual(['good', 'good', 'good']);
    await pinned.generate({ promptIds: [1, 2], maxTokens: 4, signal: signal() });
    expect(pinned.backendId).toBe('good');
    expect(late.calls).toHaveLength(0);

    late.card = limit(4096);
    await pool.probeHealth();
    await pool.learn('late');
    const next = await pool.acquire('d/0');
    expect(next.backendId).toBe('late');
    for (const lease of [pinned, ...fresh, next]) lease.release();
  });
});

describe('ListBackends shows an engine refused for serving as not usable, with the reason', () => {
  const notServed = () => Promise.reject(new ModelNotServedError('vLLM memory://wrong does not serve model "m" (GET /v1/models: it serves "other")'));

  it('an engine serving another model: not healthy in the contract view, the refusal named, not counted healthy in the stats', async () => {
    const pool = suite.makePool();
    const wrong = new ModelCardEngineDouble(unreachable, { url: 'memory://wrong', respond: () => defaultResult() });
    pool.add(wrong, { id: 'wrong', model: 'm' });
    await pool.learn('wrong');
    wrong.card = notServed;
    await pool.probeHealth();
    await pool.learn('wrong');
    const [listed] = pool.list();
    expect(listed).toMatchObject({ id: 'wrong', refusal: 'vLLM memory://wrong does not serve model "m" (GET /v1/models: it serves "other")' });
    expect(toBackend(listed!)).toMatchObject({ healthy: false, unusableReason: 'vLLM memory://wrong does not serve model "m" (GET /v1/models: it serves "other")' });
    expect(pool.stats()).toMatchObject({ backends: 1, healthy: 0, eligible: 0 });

    wrong.card = limit(4096);
    await pool.probeHealth();
    await pool.learn('wrong');
    expect(toBackend(pool.list()[0]!)).toMatchObject({ healthy: true, unusableReason: '' });
    expect(pool.stats()).toMatchObject({ healthy: 1, eligible: 1 });
  });

  it('an engine that failed its health checks says so as its reason', async () => {
    const pool = suite.makePool();
    pool.add(new ModelCardEngineDouble(limit(4096), { url: 'memory://down' }), { id: 'down', model: 'm' });
    pool.setHealthy('down', false);
    expect(toBackend(pool.list()[0]!)).toMatchObject({ healthy: false, unusableReason: 'health checks failing' });
  });

  it('an engine found returning logits once it answers (after it was added): refused like one serving another model, until it says otherwise', async () => {
    const pool = suite.makePool();
    let reported: EngineServerInfo = {};
    const good = new ModelCardEngineDouble(limit(4096), { url: 'memory://good', respond: () => defaultResult() });
    const logits = new ModelCardEngineDouble(limit(4096), { url: 'memory://logits', respond: () => defaultResult(), serverInfo: () => Promise.resolve(reported) });
    pool.add(logits, { id: 'logits', model: 'm' });
    await pool.learn('logits');
    const pinned = await pool.acquire('pinned/0');
    expect(pinned.backendId).toBe('logits');
    pool.add(good, { id: 'good', model: 'm' });
    await pool.learn('good');

    // Restarted with --logprobs-mode raw_logits while it was down: what it says when it is back is believed.
    reported = { unsupportedLogprobsMode: 'raw_logits' };
    pool.setHealthy('logits', false);
    pool.setHealthy('logits', true);
    await pool.learn('logits');
    expect(() => pool.checkEngineAgrees('logits')).toThrow(/logits, not log-probabilities/);
    expect(toBackend(pool.list().find((b) => b.id === 'logits')!)).toMatchObject({ healthy: false, unusableReason: expect.stringMatching(/raw_logits: logits, not log-probabilities/) as unknown });
    await pinned.generate({ promptIds: [1, 2], maxTokens: 4, signal: signal() });
    expect(pinned.backendId).toBe('good');
    expect(logits.calls).toHaveLength(0);

    reported = { logprobsMode: 'processed' };
    pool.setHealthy('logits', false);
    pool.setHealthy('logits', true);
    await pool.learn('logits');
    expect(toBackend(pool.list().find((b) => b.id === 'logits')!)).toMatchObject({ healthy: true, unusableReason: '' });
    pinned.release();
  });
});

describe('an SGLang engine whose token pool is smaller than its context (max_total_num_tokens < context_len)', () => {
  // SGLang's scheduler (v0.5.6, managers/scheduler.py): max_req_len = min(context_len - 1, max_total_num_tokens - 1),
  // and every request's max_new_tokens is cut to max_req_len - prompt - 1; /v1/models states context_len only.
  it('is limited by the smaller one: the pool learns it, and an answer the scheduler cut there stands as the context end', async () => {
    const pool = suite.makePool();
    const maxTotalNumTokens = suite.prompt.length + 10;
    const engine = suite.track(await FakeSglangEngine.start({ tokenizer: suite.tokenizer, model: 'policy', contextLength: 4096, maxTotalNumTokens }));
    pool.add(new SglangClient({ url: engine.url, model: 'policy' }), { id: 'sglang', model: 'policy' });
    expect((await pool.learn('sglang')).maxModelLen).toBe(maxTotalNumTokens - 1);
    const result = await generateOnce(pool, { promptIds: suite.prompt, maxTokens: 100 });
    expect(result.finishReason).toBe('length');
    expect(suite.prompt.length + result.tokenIds.length).toBe(maxTotalNumTokens - 2);
  });
});
