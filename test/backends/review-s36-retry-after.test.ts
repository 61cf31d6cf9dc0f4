import { describe, expect, it } from 'vitest';
import { parseRetryAfterMs } from '../../src/backends/engine-http.js';
import type { BackendPool } from '../../src/backends/pool.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { SglangClient } from '../../src/backends/sglang-client.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { FakeVllmEngine, type InjectedFailure } from '../../src/testing/fake-vllm.js';
import { poolSuite } from '../support/pool-suite.js';

// An engine (or the gateway in front of it) that answers 429/503 with Retry-After says when to ask again. Asking
// sooner spends the request's busy retries on answers that can only be "busy" again (its sample then ends
// BACKEND_ERROR while the engine said exactly when it would take it), and every other trajectory on that engine
// hammers it meanwhile. Retry-After is honoured as the least wait before that engine is asked again — by this request
// and every other one on it — bounded by the pool's maxRetryAfterMs.

const suite = poolSuite({ pool: { acquireTimeoutMs: 500, healthTimeoutMs: 1_000 }, question: 'What is 6 * 7?' });

const ask = () => ({ promptIds: suite.prompt, maxTokens: 64, seed: 5, signal: new AbortController().signal });

/** A fake vLLM whose first request is answered `failure`; records when each completion request arrived (monotonic and wall clock). */
async function engineBusyOnce(failure: InjectedFailure): Promise<{ engine: FakeVllmEngine; arrivals: number[]; wallClock: number[] }> {
  const arrivals: number[] = [];
  const wallClock: number[] = [];
  const engine = suite.track(
    await FakeVllmEngine.start({
      tokenizer: suite.tokenizer,
      tokenLatencyMs: 0,
      inject: ({ index }) => {
        arrivals.push(performance.now());
        wallClock.push(Date.now());
        return index === 0 ? failure : undefined;
      },
    }),
  );
  return { engine, arrivals, wallClock };
}

function addVllm(pool: BackendPool, id: string, url: string): void {
  pool.add(new VllmClient({ url, model: 'fake-qwen3' }), { id, maxConcurrency: 4, model: 'fake-qwen3', maxModelLen: 40960 });
}

describe('Retry-After on an engine\u2019s busy answer (HTTP 429/503)', () => {
  it('is the least wait before the request is asked again (delta-seconds), not the pool\u2019s 10 ms backoff', async () => {
    const { engine, arrivals } = await engineBusyOnce({ kind: 'status', status: 429, message: 'slow down', headers: { 'retry-after': '1' } });
    const pool = suite.makePool({ busyBackoffMs: 10 });
    addVllm(pool, 'busy', engine.url);
    const lease = await pool.acquire('t');
    await expect(lease.generate(ask())).resolves.toMatchObject({ backendId: 'busy', finishReason: 'stop' });
    expect(arrivals).toHaveLength(2);
    expect(arrivals[1]! - arrivals[0]!).toBeGreaterThanOrEqual(950);
  });

  it('holds every other trajectory\u2019s request to that engine too, until the time it named (HTTP-date, 503)', async () => {
    const date = new Date(Date.now() + 2_000).toUTCString(); // whole seconds: 1-2 s from now
    const { engine, arrivals, wallClock } = await engineBusyOnce({ kind: 'status', status: 503, headers: { 'retry-after': date } });
    const pool = suite.makePool({ busyBackoffMs: 10 });
    addVllm(pool, 'busy', engine.url);
    const first = await pool.acquire('t1');
    const second = await pool.acquire('t2');
    const a = first.generate(ask());
    await expect.poll(() => arrivals.length).toBe(1);
    // The 503 has been read once the first request is waiting; the second trajectory's request comes now.
    await new Promise((resolve) => setTimeout(resolve, 100));
    const b = second.generate(ask());
    await Promise.all([a, b]);
    // Both the retry and the other trajectory's first request came no sooner than the date (1-2 s after the 503).
    for (const at of wallClock.slice(1)) expect(at).toBeGreaterThanOrEqual(Date.parse(date) - 20);
    expect(arrivals).toHaveLength(3);
  });

  it('is bounded by maxRetryAfterMs: an engine asking for an hour is asked again after the bound', async () => {
    const { engine, arrivals } = await engineBusyOnce({ kind: 'status', status: 429, headers: { 'retry-after': '3600' } });
    const pool = suite.makePool({ busyBackoffMs: 10, maxRetryAfterMs: 300 });
    addVllm(pool, 'busy', engine.url);
    const lease = await pool.acquire('t');
    await expect(lease.generate(ask())).resolves.toMatchObject({ finishReason: 'stop' });
    expect(arrivals[1]! - arrivals[0]!).toBeGreaterThanOrEqual(280);
    expect(arrivals[1]! - arrivals[0]!).toBeLessThan(3_000);
  });

  it('is read from SGLang\u2019s busy answers too', async () => {
    const arrivals: number[] = [];
    const engine = suite.track(
      await FakeSglangEngine.start({
        tokenizer: suite.tokenizer,
        inject: ({ index }) => {
          arrivals.push(performance.now());
          return index === 0 ? { kind: 'status', status: 429, headers: { 'retry-after': '1' } } : undefined;
        },
      }),
    );
    const pool = suite.makePool({ busyBackoffMs: 10 });
    pool.add(new SglangClient({ url: engine.url, model: 'fake-qwen3' }), { id: 's', maxConcurrency: 4, model: 'fake-qwen3', maxModelLen: 40959 });
    const lease = await pool.acquire('t');
    await expect(lease.generate(ask())).resolves.toMatchObject({ finishReason: 'stop' });
    expect(arrivals[1]! - arrivals[0]!).toBeGreaterThanOrEqual(950);
  });

  it('parseRetryAfterMs: delta-seconds or an HTTP-date; anything else (negative, fractional, garbage) is no hint', () => {
    const now = Date.parse('Thu, 03 Dec 2026 12:00:00 GMT');
    expect(parseRetryAfterMs('0', now)).toBe(0);
    expect(parseRetryAfterMs(' 7 ', now)).toBe(7_000);
    expect(parseRetryAfterMs('Thu, 03 Dec 2026 12:00:05 GMT', now)).toBe(5_000);
    expect(parseRetryAfterMs('Thu, 03 Dec 2026 11:59:00 GMT', now)).toBe(0);
    for (const bad of [undefined, '', '-1', '1.5', 'soon', '3 s']) expect(parseRetryAfterMs(bad, now)).toBeUndefined();
    expect(parseRetryAfterMs('99999999999999999999', now)).toBeGreaterThan(1e12);
    expect(parseRetryAfterMs(['3', '9'], now)).toBe(3_000);
  });
});
