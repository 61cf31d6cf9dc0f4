import { describe, expect, it } from 'vitest';
import type { PoolLease } from '../../src/backends/lease.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { poolSuite } from '../support/pool-suite.js';
import { eventually } from '../support/wait.js';

// An engine that answered busy with a Retry-After holds every request to it until then (BackendState.retryNotBefore),
// but the picker still placed NEW trajectories there by load while other engines were free: each new trajectory then
// waited out the hold (up to maxRetryAfterMs, 60 s) beside an idle engine. New trajectories now go to an engine that
// is neither paused nor held while there is one, as for a paused engine; trajectories already on the held engine stay
// and wait for it (it is alive and has their prefixes cached: failover is for engines gone). The engines are fake
// vLLMs over real HTTP (test doubles).

const suite = poolSuite({ pool: { acquireTimeoutMs: 5_000, healthTimeoutMs: 1_000 }, question: 'What is 6 * 7?' });

describe('a new trajectory while an engine is held by its Retry-After', () => {
  it('goes to a free engine, even a more loaded one, while the held engine\u2019s own trajectory waits for it', async () => {
    const arrivals: string[] = [];
    const busy = suite.track(
      await FakeVllmEngine.start({
        tokenizer: suite.tokenizer,
        tokenLatencyMs: 0,
        inject: ({ index }) => {
          arrivals.push('busy');
          return index === 0 ? { kind: 'status', status: 429, message: 'queue full', headers: { 'retry-after': '30' } } : undefined;
        },
      }),
    );
    const free = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0, inject: () => void arrivals.push('free') }));
    const pool = suite.makePool({ busyBackoffMs: 10 });
    // By load alone "busy" (8 slots) is the pick until it carries 8 times what "free" (1 slot) does.
    pool.add(new VllmClient({ url: busy.url, model: 'fake-qwen3' }), { id: 'busy', maxConcurrency: 8, model: 'fake-qwen3', maxModelLen: 40960 });
    pool.add(new VllmClient({ url: free.url, model: 'fake-qwen3' }), { id: 'free', maxConcurrency: 1, model: 'fake-qwen3', maxModelLen: 40960 });

    const first = (await pool.acquire('t1')) as PoolLease;
    expect(first.backendId).toBe('busy');
    const waiting = new AbortController();
    const held = first.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: waiting.signal }).catch((err: unknown) => err);
    await eventually(() => first.backend.retryNotBefore > performance.now(), 'the 429 read and its Retry-After in effect');
    // Load alone would choose "busy"; pick(), like acquire, passes over the held engine (review-s39-pick-ready).
    expect(pool.pick()).toMatchObject({ type: 'pick', backend: { id: 'free' } });

    const second = await pool.acquire('t2');
    expect(second.backendId).toBe('free');
    await expect(second.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 2, signal: new AbortController().signal })).resolves.toMatchObject({ backendId: 'free' });
    // The held engine was not asked again, and its trajectory stayed on it (sticky), waiting out the hold.
    expect(arrivals).toEqual(['busy', 'free']);
    expect(first.backendId).toBe('busy');
    waiting.abort(new Error('test over'));
    await held;
    first.release();
    second.release();
  });

  it('still goes to the held engine when every engine is held or paused (it waits there rather than nowhere)', async () => {
    const busy = suite.track(
      await FakeVllmEngine.start({
        tokenizer: suite.tokenizer,
        tokenLatencyMs: 0,
        inject: ({ index }) => (index === 0 ? { kind: 'status', status: 503, headers: { 'retry-after': '30' } } : undefined),
      }),
    );
    const pool = suite.makePool({ busyBackoffMs: 10 });
    pool.add(new VllmClient({ url: busy.url, model: 'fake-qwen3' }), { id: 'only', maxConcurrency: 4, model: 'fake-qwen3', maxModelLen: 40960 });
    const first = (await pool.acquire('t1')) as PoolLease;
    const waiting = new AbortController();
    const held = first.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: waiting.signal }).catch((err: unknown) => err);
    await eventually(() => first.backend.retryNotBefore > performance.now(), 'the 503 read and its Retry-After in effect');
    const second = await pool.acquire('t2');
    expect(second.backendId).toBe('only');
    waiting.abort(new Error('test over'));
    await held;
    first.release();
    second.release();
  });
});
