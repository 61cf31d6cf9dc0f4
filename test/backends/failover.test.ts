import { describe, expect, it } from 'vitest';
import type { BackendPool } from '../../src/backends/pool.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { describeError } from '../../src/errors.js';
import { FakeVllmEngine, type FakeVllmOptions } from '../../src/testing/fake-vllm.js';
import { poolSuite } from '../support/pool-suite.js';
import { deadUrl } from '../support/server-harness.js';

// A dead engine (process gone, connection refused or reset mid-request) against the pool, over real HTTP to the
// fake vLLM: the trajectory's request moves to another engine at once, nothing of the lost request is kept, and
// when nothing can serve it the request ends backend_error with the cause after bounded attempts — never hangs.

const suite = poolSuite({ pool: { acquireTimeoutMs: 500, healthTimeoutMs: 1_000 }, question: 'What is 6 * 7?' });
const makePool = suite.makePool;

async function engine(options: Partial<FakeVllmOptions> = {}): Promise<FakeVllmEngine> {
  return suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0, ...options }));
}

function addVllm(pool: BackendPool, id: string, url: string, model = 'fake-qwen3'): void {
  pool.add(new VllmClient({ url, model }), { id, maxConcurrency: 4, model, maxModelLen: 40960 });
}

const ask = () => ({ promptIds: suite.prompt, maxTokens: 64, seed: 5, signal: new AbortController().signal });

describe('failover from a dead engine', () => {
  it('an engine killed mid-request: marked unhealthy at once, the request moves to the other engine, whose answer alone is kept', async () => {
    const dying = await engine({ tokenLatencyMs: 20 });
    const answers: number[][] = [];
    const recorder = await engine({ onCompletion: (c) => answers.push([...c.tokenIds]) });
    const pool = makePool();
    addVllm(pool, 'dying', dying.url);
    const lease = await pool.acquire('t');
    addVllm(pool, 'other', recorder.url);
    const out = lease.generate(ask());
    await expect.poll(() => dying.stats().inflight).toBe(1);
    await dying.close(); // the process is gone: its connection is reset, new ones are refused
    const result = await out;
    expect(result.backendId).toBe('other');
    expect(result.tokenIds).toEqual(answers[0]);
    expect(lease.failovers).toBe(1);
    expect(pool.list().map((b) => [b.id, b.healthy])).toEqual([['dying', false], ['other', true]]);
  });

  it('a dropped connection to a live engine is tried again on it (its health answers): no failover', async () => {
    const flaky = await engine();
    flaky.failNext(1, { kind: 'drop' });
    const pool = makePool();
    addVllm(pool, 'flaky', flaky.url);
    const lease = await pool.acquire('t');
    await expect(lease.generate(ask())).resolves.toMatchObject({ backendId: 'flaky', finishReason: 'stop' });
    expect(flaky.stats()).toMatchObject({ received: 2, served: 1 });
    expect(lease.failovers).toBe(0);
    expect(pool.list()[0]!.healthy).toBe(true);
  });

  it('a dropped connection to an engine whose health answers late (past the probe budget): not marked unhealthy, tried again on it', async () => {
    const slow = await engine();
    slow.failNext(1, { kind: 'drop' });
    slow.setHealthLatency(400);
    const pool = makePool({ healthTimeoutMs: 100 });
    addVllm(pool, 'slow', slow.url);
    const lease = await pool.acquire('t');
    await expect(lease.generate(ask())).resolves.toMatchObject({ backendId: 'slow', finishReason: 'stop' });
    expect(slow.stats()).toMatchObject({ received: 2, served: 1, healthChecks: 1 });
    expect(pool.list()[0]!.healthy).toBe(true);
  });

  it('an engine that drops every request: backend_error after maxFailoversPerRequest + 1 attempts, naming the cause', async () => {
    const broken = await engine({ inject: () => ({ kind: 'drop' }) });
    const pool = makePool({ maxFailoversPerRequest: 2 });
    addVllm(pool, 'broken', broken.url);
    const lease = await pool.acquire('t');
    const err = await lease.generate(ask()).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'backend_error' });
    expect(describeError(err)).toMatch(/lost its backend 3 times .*unreachable: (ECONNRESET|socket hang up|UND_ERR_SOCKET: other side closed)/);
    expect(broken.stats().received).toBe(3);
  });

  it('every engine dead: backend_error once no other backend turns up within the acquire timeout, naming what was lost', async () => {
    const pool = makePool({ acquireTimeoutMs: 300 });
    addVllm(pool, 'gone', await deadUrl());
    const lease = await pool.acquire('t');
    const started = Date.now();
    const err = await lease.generate(ask()).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'backend_error' });
    expect(describeError(err)).toMatch(/lost backend gone unreachable and found no other backend: no eligible backend within 300 ms.*ECONNREFUSED/);
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(pool.list()[0]!.healthy).toBe(false);
  });

  it('requests of several trajectories on the killed engine all move (one health check for all of them)', async () => {
    const dying = await engine({ tokenLatencyMs: 20 });
    const pool = makePool();
    addVllm(pool, 'dying', dying.url);
    const leases = await Promise.all([0, 1, 2].map((i) => pool.acquire(`t${i}`)));
    const healthy = await engine();
    addVllm(pool, 'other', healthy.url);
    const outs = leases.map((lease) => lease.generate(ask()));
    await expect.poll(() => dying.stats().inflight).toBe(3);
    await dying.close();
    const results = await Promise.all(outs);
    expect(results.map((r) => r.backendId)).toEqual(['other', 'other', 'other']);
    expect(healthy.requestsServed).toBe(3);
    for (const lease of leases) lease.release();
    expect(pool.stats()).toMatchObject({ leases: 0, inflightTrajectories: 0, inflightRequests: 0, failovers: 3 });
  });
});

describe('an engine that answers busy (HTTP 429 or 503: its waiting queue is full, nothing sampled)', () => {
  it('is asked again after a backoff, on the same engine, and the answer that finally comes is the one kept', async () => {
    const busy = await engine();
    busy.failNext(2, { kind: 'status', status: 429, message: 'waiting queue is full' });
    const pool = makePool({ busyBackoffMs: 20 });
    addVllm(pool, 'busy', busy.url);
    const lease = await pool.acquire('t');
    await expect(lease.generate(ask())).resolves.toMatchObject({ backendId: 'busy', finishReason: 'stop' });
    expect(busy.stats()).toMatchObject({ received: 3, served: 1 });
    expect(lease.failovers).toBe(0);
    expect(pool.list()[0]!.healthy).toBe(true);
  });

  it('ends backend_error after maxBusyRetries + 1 answers, saying the engine was busy and how it answered', async () => {
    const busy = await engine();
    busy.failNext(100, { kind: 'status', status: 503, message: 'overloaded' });
    const pool = makePool({ busyBackoffMs: 5, maxBusyRetries: 2 });
    addVllm(pool, 'busy', busy.url);
    const lease = await pool.acquire('t');
    const err = await lease.generate(ask()).catch((e: unknown) => e);
    expect(describeError(err)).toMatch(/the engine was busy 3 times in a row \(last: vLLM .* answered HTTP 503 \(busy\)\)/);
    expect(busy.stats().received).toBe(3);
  });

  it('stops waiting at once when the request is cancelled during its backoff', async () => {
    const busy = await engine();
    busy.failNext(100, { kind: 'status', status: 429 });
    const pool = makePool({ busyBackoffMs: 60_000 });
    addVllm(pool, 'busy', busy.url);
    const lease = await pool.acquire('t');
    const controller = new AbortController();
    const out = lease.generate({ ...ask(), signal: controller.signal }).catch((e: unknown) => e);
    await expect.poll(() => busy.stats().received).toBe(1);
    controller.abort(new Error('trajectory cancelled'));
    expect(await out).toMatchObject({ code: 'cancelled' });
  });
});
