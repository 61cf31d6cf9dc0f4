import { describe, expect, it } from 'vitest';
import { SglangClient } from '../../src/backends/sglang-client.js';
import type { GenerateRequest } from '../../src/backends/types.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { RolloutError } from '../../src/errors.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';
import { poolSuite } from '../support/pool-suite.js';

// The pool's half of PauseGeneration / ResumeGeneration: held requests, the three modes, versions per answer.
// Engines are the in-memory double (exact control of when a request ends) or the fake vLLM/SGLang over real HTTP
// (their pause routes, decoding at a fixed latency per token so requests are in flight long enough to pause).

const suite = poolSuite({ pool: { acquireTimeoutMs: 100 }, question: 'What is 17 * 23 + 5?' });
const makePool = suite.makePool;

async function fakeVllm(tokenLatencyMs = 10, devMode = true): Promise<{ engine: FakeVllmEngine; client: VllmClient }> {
  const engine = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs, devMode }));
  return { engine, client: new VllmClient({ url: engine.url, model: engine.model }) };
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
const request = (signal = new AbortController().signal): GenerateRequest => ({ promptIds: [1, 2], maxTokens: 4, signal });
const ask = (signal = new AbortController().signal, seed = 3): GenerateRequest => ({ promptIds: suite.prompt, maxTokens: 256, seed, signal });

/** Whether a promise has settled, read synchronously. */
function track<T>(promise: Promise<T>): { settled: () => boolean } {
  let done = false;
  promise.then(
    () => (done = true),
    () => (done = true),
  );
  return { settled: () => done };
}

describe('BackendPool.pause holds new requests', () => {
  it('a held request neither fails, nor fails over, nor times out against acquireTimeoutMs; it goes on at resume', async () => {
    const pool = makePool({ acquireTimeoutMs: 50 });
    const a = new InMemoryEngineClient();
    const b = new InMemoryEngineClient();
    pool.add(a, { id: 'a', maxConcurrency: 2, model: 'm' });
    const lease = await pool.acquire('t');
    pool.add(b, { id: 'b', maxConcurrency: 2, model: 'm' });
    const paused = await pool.pause('wait', { id: 'a' });
    expect(paused).toMatchObject([{ id: 'a', paused: true }]);
    const out = lease.generate(request());
    const flag = track(out);
    await sleep(300); // six acquire timeouts
    expect(flag.settled()).toBe(false);
    expect(a.calls).toHaveLength(0);
    expect(b.calls).toHaveLength(0);
    expect(pool.list().find((x) => x.id === 'a')).toMatchObject({ paused: true, inflightRequests: 1, inflightTrajectories: 1 });
    await pool.resume({ id: 'a', policyVersion: 4 });
    await expect.poll(() => a.pending.length).toBe(1);
    a.pending[0]!.resolve();
    await expect(out).resolves.toMatchObject({ backendId: 'a', policyVersionStart: 4, policyVersion: 4 });
    expect(lease.failovers).toBe(0);
  });

  it('a held request still honours its own signal (run timeout, cancellation)', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 2, model: 'm' });
    const lease = await pool.acquire('t');
    await pool.pause('wait');
    const out = lease.generate(request(AbortSignal.timeout(100)));
    await expect(out).rejects.toMatchObject({ code: 'deadline_exceeded' });
    expect(pool.stats()).toMatchObject({ inflightRequests: 0 });
  });

  it('new trajectories go to backends that are not paused while there are any, else wait on a paused one', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 8, model: 'm' });
    pool.add(new InMemoryEngineClient(), { id: 'b', maxConcurrency: 8, model: 'm' });
    await pool.pause('wait', { id: 'a' });
    const placed = [];
    for (let i = 0; i < 4; i++) placed.push((await pool.acquire(`t${i}`)).backendId);
    expect(placed).toEqual(['b', 'b', 'b', 'b']);
    await pool.pause('wait', { id: 'b' });
    // Everything is paused: the trajectory is placed anyway (its requests wait in the gate), no acquire timeout.
    expect((await pool.acquire('late')).backendId).toBe('a');
  });

  it('a pool-wide pause holds backends added before the pool-wide resume, which gives them the resumed version', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 2, model: 'm', policyVersion: 1 });
    await pool.pause('wait');
    const late = new InMemoryEngineClient({ respond: () => ({ tokenIds: [5], logprobs: [-1], finishReason: 'stop', text: '' }) });
    pool.add(late, { id: 'late', maxConcurrency: 2, model: 'm' });
    expect(pool.list().map((b) => [b.id, b.paused])).toEqual([['a', true], ['late', true]]);
    pool.setHealthy('a', false);
    const lease = await pool.acquire('t');
    const out = lease.generate(request());
    await sleep(50);
    expect(late.calls).toHaveLength(0);
    const resumed = await pool.resume({ policyVersion: 2 });
    expect(resumed.map((b) => [b.id, b.paused, b.policyVersion])).toEqual([['a', false, 2], ['late', false, 2]]);
    await expect(out).resolves.toMatchObject({ backendId: 'late', policyVersion: 2 });
    // Added after the resume: the pool's version, unpaused.
    expect(pool.add(new InMemoryEngineClient(), { id: 'later', maxConcurrency: 1, model: 'm' })).toMatchObject({ paused: false, policyVersion: 2 });
  });

  it('removing a paused backend moves its held requests to another backend', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 2, model: 'm' });
    const lease = await pool.acquire('t');
    const b = new InMemoryEngineClient({ respond: () => ({ tokenIds: [7], logprobs: [-1], finishReason: 'stop', text: '' }) });
    pool.add(b, { id: 'b', maxConcurrency: 2, model: 'm' });
    await pool.pause('wait', { id: 'a' });
    const out = lease.generate(request());
    await sleep(20);
    await pool.remove('a', { drain: false });
    await expect(out).resolves.toMatchObject({ backendId: 'b', tokenIds: [7] });
    expect(lease.failovers).toBe(1);
  });
});

describe('BackendPool.pause modes', () => {
  it('keep: a request frozen longer than its engine client\u2019s request budget continues on resume (time paused is not counted)', async () => {
    // Scaled down: a 1 s budget, a 1.5 s weight update. The budget kept running while the engine held the request
    // frozen, so every request in flight failed backend_error "did not answer within" after any longer update.
    const engine = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 10, devMode: true, policy: () => 'word '.repeat(300) }));
    const pool = makePool();
    pool.add(new VllmClient({ url: engine.url, model: engine.model, requestTimeoutMs: 1_000 }), { id: 'a', model: engine.model, maxConcurrency: 4, maxModelLen: 40960 });
    const lease = await pool.acquire('t');
    const out = lease.generate({ ...ask(), maxTokens: 20 }); // ~200 ms of decoding in all
    await expect.poll(() => engine.inflightRequestIds().length).toBe(1);
    await sleep(50);
    await pool.pause('keep');
    await sleep(1_500);
    await pool.resume({ policyVersion: 1 });
    await expect(out).resolves.toMatchObject({ policyVersionStart: 0, policyVersion: 1 });
    // Unpaused, the budget still holds: a request that outlives it fails.
    const slow = await pool.acquire('t2');
    const late = await slow.generate({ ...ask(), maxTokens: 200 }).catch((e: unknown) => e);
    expect(late).toBeInstanceOf(RolloutError);
    expect((late as RolloutError).message).toContain('did not answer within 1000 ms');
    lease.release();
    slow.release();
  });

  it('wait: resolves only once the requests in flight have finished, unaborted, on any engine (emulated by the pool)', async () => {
    const pool = makePool();
    const a = new InMemoryEngineClient();
    pool.add(a, { id: 'a', maxConcurrency: 2, model: 'm' });
    const lease = await pool.acquire('t');
    const running = lease.generate(request());
    await expect.poll(() => a.pending.length).toBe(1);
    const pausing = pool.pause('wait');
    const flag = track(pausing);
    await sleep(100);
    expect(flag.settled()).toBe(false);
    a.pending[0]!.resolve({ tokenIds: [4, 4] });
    await expect(running).resolves.toMatchObject({ finishReason: 'stop', tokenIds: [4, 4], policyVersionStart: 0, policyVersion: 0 });
    await expect(pausing).resolves.toMatchObject([{ id: 'a', paused: true }]);
  });

  it('wait on a vLLM: the pool waits for its requests, then pauses the engine with its own wait mode', async () => {
    const { engine, client } = await fakeVllm(3);
    const pool = makePool();
    pool.add(client, { id: 'v', maxConcurrency: 4, model: engine.model, maxModelLen: 40960 });
    const lease = await pool.acquire('t');
    const running = lease.generate(ask());
    const flag = track(running);
    await expect.poll(() => engine.inflightRequestIds().length).toBe(1);
    await pool.pause('wait');
    expect(flag.settled()).toBe(true);
    expect(engine.paused).toBe(true);
    expect((await running).finishReason).toBe('stop');
    await pool.resume({ policyVersion: 1 });
    expect(engine.paused).toBe(false);
  });

  it('abort: in-flight requests come back "abort" with their partial tokens and the old version before the pause answers; later ones get the new version', async () => {
    const { engine, client } = await fakeVllm(10);
    const pool = makePool();
    pool.add(client, { id: 'v', maxConcurrency: 4, model: engine.model, maxModelLen: 40960, policyVersion: 7 });
    const lease = await pool.acquire('t');
    const running = lease.generate(ask());
    const flag = track(running);
    await expect.poll(() => engine.inflightRequestIds().length).toBe(1);
    await sleep(50);
    await pool.pause('abort');
    expect(flag.settled()).toBe(true);
    const aborted = await running;
    expect(aborted).toMatchObject({ finishReason: 'abort', policyVersionStart: 7, policyVersion: 7 });
    expect(aborted.tokenIds.length).toBeGreaterThan(0);
    const reference = await (await fakeVllm(0)).client.generate(ask());
    expect(reference.tokenIds.slice(0, aborted.tokenIds.length)).toEqual(aborted.tokenIds);
    const next = lease.generate(ask());
    await sleep(50);
    expect(engine.stats().received).toBe(1); // held in the pool, not sent
    await pool.resume({ policyVersion: 8 });
    await expect(next).resolves.toMatchObject({ finishReason: 'stop', policyVersionStart: 8, policyVersion: 8 });
  });

  it('keep: a request frozen across the update continues after resume and records both versions', async () => {
    const { engine, client } = await fakeVllm(5);
    const pool = makePool();
    pool.add(client, { id: 'v', maxConcurrency: 4, model: engine.model, maxModelLen: 40960, policyVersion: 1 });
    const lease = await pool.acquire('t');
    const running = lease.generate(ask(undefined, 8));
    const flag = track(running);
    await expect.poll(() => engine.inflightRequestIds().length).toBe(1);
    await pool.pause('keep');
    await sleep(300);
    expect(flag.settled()).toBe(false);
    await pool.resume({ policyVersion: 2 });
    const out = await running;
    expect(out).toMatchObject({ finishReason: 'stop', policyVersionStart: 1, policyVersion: 2 });
    const reference = await (await fakeVllm(0)).client.generate(ask(undefined, 8));
    expect(out.tokenIds).toEqual(reference.tokenIds);
  });

  it('a mode the engine lacks is failed_precondition and pauses nothing; SGLang keeps abort and keep, and waits through the pool', async () => {
    const sglang = suite.track(await FakeSglangEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 5 }));
    const pool = makePool();
    pool.add(new SglangClient({ url: sglang.url, model: 'm' }), { id: 's', maxConcurrency: 2, model: 'm', maxModelLen: 40960 });
    pool.add(new InMemoryEngineClient(), { id: 'mem', maxConcurrency: 2, model: 'm' });
    const err = await pool.pause('keep').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RolloutError);
    expect(err).toMatchObject({ code: 'failed_precondition' });
    expect((err as Error).message).toContain('mem (vllm)');
    expect(pool.list().map((b) => b.paused)).toEqual([false, false]);
    await pool.pause('keep', { id: 's' });
    expect(sglang.paused).toBe(true);
    await pool.resume({ id: 's' });
    expect(sglang.paused).toBe(false);
    await pool.pause('wait'); // SGLang has no wait mode: the pool waits for its requests, the engine is not paused
    expect(sglang.paused).toBe(false);
    expect(pool.list().map((b) => b.paused)).toEqual([true, true]);
    await pool.resume();
  });

  it('an engine that refuses its pause call (vLLM without VLLM_SERVER_DEV_MODE) is left unpaused and named', async () => {
    const { engine, client } = await fakeVllm(0, false);
    const pool = makePool();
    pool.add(client, { id: 'prod', maxConcurrency: 2, model: engine.model, maxModelLen: 40960 });
    const err = await pool.pause('abort').catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'failed_precondition' });
    expect((err as Error).message).toMatch(/could not pause prod in abort mode \(left unpaused\): .*HTTP 404/);
    expect(pool.list()[0]!.paused).toBe(false);
    const lease = await pool.acquire('t');
    await expect(lease.generate(ask())).resolves.toMatchObject({ finishReason: 'stop' });
  });
});
