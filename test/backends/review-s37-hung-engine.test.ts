import { describe, expect, it } from 'vitest';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { poolSuite } from '../support/pool-suite.js';
import { eventually, within } from '../support/wait.js';

// A stall BEFORE an answer's headers is a long generation as far as the request can tell (vLLM and SGLang send a
// non-streaming answer whole when it is done), so only backendRequestTimeoutMs (300 s) bounds it. An engine hung as a
// whole — its health endpoint hanging too — is caught by the prober instead: its probes time out, after
// failureThreshold of them it is marked unhealthy, which aborts its running requests and moves them (failover), long
// before the request timeout. (An engine whose /health still answers 200 while its generation is stuck is caught by
// the stall watchdog from its /metrics counters: review-s39-stall-watchdog.test.ts.) The engines are fake vLLMs over real HTTP (test doubles).

const suite = poolSuite({ question: 'What is 6 * 7?' });

describe('an engine hung as a whole (no answer, health hanging too)', () => {
  it('is marked unhealthy by its probes and the request waiting on it moves, without waiting for the request timeout', async () => {
    const hung = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0, inject: () => ({ kind: 'hang' }) }));
    const good = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0 }));
    const pool = suite.makePool({ healthIntervalMs: 100, healthTimeoutMs: 200, healthFailureThreshold: 2, acquireTimeoutMs: 30_000 });
    // A request timeout far past the test's own bound: only the prober can end the wait in time.
    pool.add(new VllmClient({ url: hung.url, model: 'fake-qwen3', requestTimeoutMs: 600_000 }), { id: 'hung', maxConcurrency: 8, model: 'fake-qwen3', maxModelLen: 40960 });
    pool.add(new VllmClient({ url: good.url, model: 'fake-qwen3', requestTimeoutMs: 600_000 }), { id: 'good', maxConcurrency: 1, model: 'fake-qwen3', maxModelLen: 40960 });
    const lease = await pool.acquire('t');
    expect(lease.backendId).toBe('hung');
    const answer = lease.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: new AbortController().signal });
    await eventually(() => hung.stats().received === 1, 'the request at the hung engine');
    hung.setHealthLatency(3_600_000); // the whole engine hangs now
    pool.startHealthChecks();
    await expect(within(answer, 60_000, 'the request to move off the hung engine')).resolves.toMatchObject({ backendId: 'good', finishReason: expect.any(String) });
    expect(pool.list().find((b) => b.id === 'hung')?.healthy).toBe(false);
    pool.stopHealthChecks();
    lease.release();
  });
});
