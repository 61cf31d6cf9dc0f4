import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { createLogger } from '../../src/observability/logger.js';
import type { GenerateRequest } from '../../src/backends/types.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { poolSuite } from '../support/pool-suite.js';

const makePool = poolSuite({ pool: { acquireTimeoutMs: 1_000 } }).makePool;

const flush = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));
const request = (signal = new AbortController().signal): GenerateRequest => ({ promptIds: [1, 2], maxTokens: 4, signal });

async function codeOf(promise: Promise<unknown>): Promise<string> {
  return promise.then(
    () => 'resolved',
    (err: unknown) => (err instanceof RolloutError ? err.code : `not a RolloutError: ${String(err)}`),
  );
}

describe('BackendPool routing', () => {
  it('places each new trajectory on the least-loaded backend of equal capacity, ties broken by id', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient(), { id: 'b', maxConcurrency: 4, model: 'm' });
    pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 4, model: 'm' });
    const placed = [];
    for (let i = 0; i < 5; i++) placed.push((await pool.acquire(`t${i}`)).backendId);
    expect(placed).toEqual(['a', 'b', 'a', 'b', 'a']);
    expect(pool.list().map((b) => [b.id, b.inflightTrajectories, b.assignedTotal])).toEqual([['b', 2, 2], ['a', 3, 3]]);
  });

  it('shares trajectories between engines in proportion to their max concurrency', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient(), { id: 'small', maxConcurrency: 16, model: 'm' });
    pool.add(new InMemoryEngineClient(), { id: 'large', maxConcurrency: 64, model: 'm' });
    for (let i = 0; i < 100; i++) await pool.acquire(`t${i}`);
    expect(pool.list().map((b) => [b.id, b.inflightTrajectories])).toEqual([['small', 20], ['large', 80]]);
  });

  it('keeps a trajectory on its backend for every turn, and release frees it exactly once', async () => {
    const pool = makePool();
    const clients = ['a', 'b', 'c'].map((id) => {
      const client = new InMemoryEngineClient({ respond: () => ({ tokenIds: [7], logprobs: [-1], finishReason: 'stop', text: id }) });
      pool.add(client, { id, maxConcurrency: 8, model: 'm' });
      return client;
    });
    const lease = await pool.acquire('traj');
    for (let i = 0; i < 4; i++) {
      await pool.acquire(`other${i}`); // load moves around; the lease must not
      const out = await lease.generate(request());
      expect(out.backendId).toBe(lease.backendId);
    }
    expect(clients.filter((c) => c.calls.length > 0)).toHaveLength(1);
    lease.release();
    lease.release();
    expect(lease.backendId).toBe('a');
    expect(pool.list().map((b) => [b.id, b.inflightTrajectories])).toEqual([['a', 1], ['b', 2], ['c', 1]]);
    expect(pool.stats().leases).toBe(4);
    await expect(lease.generate(request())).rejects.toMatchObject({ code: 'failed_precondition' });
  });

  it('runs at most maxConcurrency requests per backend and queues the rest in arrival order among first turns', async () => {
    const pool = makePool();
    const engine = new InMemoryEngineClient();
    pool.add(engine, { id: 'a', maxConcurrency: 2, model: 'm' });
    const leases = await Promise.all([0, 1, 2, 3, 4].map((i) => pool.acquire(`t${i}`)));
    const results = leases.map((lease, i) => lease.generate({ ...request(), promptIds: [i] }));
    await flush();
    expect(engine.running).toBe(2);
    expect(pool.list()[0]).toMatchObject({ inflightRequests: 5, queuedRequests: 3 });
    while (engine.pending.length > 0) {
      engine.pending[0]!.resolve();
      await flush();
    }
    await Promise.all(results);
    expect(engine.calls.map((c) => c.promptIds[0])).toEqual([0, 1, 2, 3, 4]);
    expect(engine.maxRunning).toBe(2);
    expect(pool.list()[0]).toMatchObject({ inflightRequests: 0, queuedRequests: 0 });
  });

  it('serves a queued request of a trajectory deeper into its turns before first turns, unless queueOrder is fifo', async () => {
    for (const queueOrder of ['turns', 'fifo'] as const) {
      const pool = makePool({ queueOrder });
      const engine = new InMemoryEngineClient();
      pool.add(engine, { id: 'a', maxConcurrency: 1, model: 'm' });
      const [deep, x, y] = await Promise.all(['deep', 'x', 'y'].map((k) => pool.acquire(k)));
      const first = deep!.generate({ ...request(), promptIds: [0] });
      await flush();
      engine.pending[0]!.resolve();
      await first; // `deep` has run one turn
      const blocker = x!.generate({ ...request(), promptIds: [1] });
      await flush();
      const later = [y!.generate({ ...request(), promptIds: [2] }), deep!.generate({ ...request(), promptIds: [3] })];
      await flush();
      while (engine.pending.length > 0) {
        engine.pending[0]!.resolve();
        await flush();
      }
      await Promise.all([blocker, ...later]);
      // y (its first turn) arrived before deep's second turn; `turns` serves deep first, `fifo` by arrival.
      expect(engine.calls.map((c) => c.promptIds[0])).toEqual(queueOrder === 'turns' ? [0, 1, 3, 2] : [0, 1, 2, 3]);
    }
  });

  it('lets a queued request be aborted without disturbing the queue', async () => {
    const pool = makePool();
    const engine = new InMemoryEngineClient();
    pool.add(engine, { id: 'a', maxConcurrency: 1, model: 'm' });
    const [l1, l2, l3] = await Promise.all(['x', 'y', 'z'].map((k) => pool.acquire(k)));
    const first = l1!.generate(request());
    const cancel = new AbortController();
    const second = l2!.generate(request(cancel.signal));
    const third = l3!.generate(request());
    await flush();
    cancel.abort();
    expect(await codeOf(second)).toBe('cancelled');
    engine.pending[0]!.resolve();
    await first;
    await flush();
    engine.pending[0]!.resolve();
    await third;
    expect(engine.calls).toHaveLength(2);
    expect(pool.list()[0]).toMatchObject({ inflightRequests: 0, queuedRequests: 0 });
  });

  it('passes an engine failure through as backend_error without moving the trajectory', async () => {
    const pool = makePool();
    const engine = new InMemoryEngineClient();
    pool.add(engine, { id: 'a', maxConcurrency: 1, model: 'm' });
    pool.add(new InMemoryEngineClient(), { id: 'b', maxConcurrency: 1, model: 'm' });
    const lease = await pool.acquire('t');
    const out = lease.generate(request());
    await flush();
    engine.pending[0]!.reject(new Error('CUDA out of memory'));
    expect(await codeOf(out)).toBe('backend_error');
    expect(lease.failovers).toBe(0);
  });
});

describe('BackendPool membership and health', () => {
  it('drains: no new trajectories, resolves when the last one ends', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 1, model: 'm' });
    pool.add(new InMemoryEngineClient(), { id: 'b', maxConcurrency: 1, model: 'm' });
    const lease = await pool.acquire('t');
    expect(lease.backendId).toBe('a');
    let drained = false;
    const removal = pool.remove('a', { drain: true }).then(() => (drained = true));
    expect((await pool.acquire('u')).backendId).toBe('b');
    expect((await pool.acquire('v')).backendId).toBe('b');
    await flush();
    expect(drained).toBe(false);
    expect(pool.list().find((b) => b.id === 'a')?.draining).toBe(true);
    lease.release();
    await removal;
    expect(pool.list().map((b) => b.id)).toEqual(['b']);
  });

  it('a drain whose call ends first (deadline, cancel) stops waiting and changes nothing: the backend takes trajectories again', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 1, model: 'm' });
    const lease = await pool.acquire('t');
    const call = new AbortController();
    const removal = pool.remove('a', { drain: true, signal: call.signal });
    await flush();
    expect(pool.list()[0]).toMatchObject({ id: 'a', draining: true });
    call.abort(new RolloutError('deadline_exceeded', 'RemoveBackend deadline'));
    expect(await codeOf(removal)).toBe('deadline_exceeded');
    expect(pool.list()[0]).toMatchObject({ id: 'a', draining: false });
    const again = await pool.acquire('u');
    expect(again.backendId).toBe('a');
    // Two drains: the one whose call ends leaves the other waiting, and the backend draining.
    const first = new AbortController();
    const one = pool.remove('a', { drain: true, signal: first.signal });
    const two = pool.remove('a', { drain: true });
    await flush();
    first.abort(new RolloutError('cancelled', 'client went away'));
    expect(await codeOf(one)).toBe('cancelled');
    expect(pool.list()[0]).toMatchObject({ draining: true });
    lease.release();
    again.release();
    await two;
    expect(pool.list()).toEqual([]);
    pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 1, model: 'm' });
    // An already-cancelled call does not start draining for good either.
    const gone = new AbortController();
    gone.abort();
    const held = await pool.acquire('w');
    expect(await codeOf(pool.remove('a', { drain: true, signal: gone.signal }))).toBe('cancelled');
    expect(pool.list()[0]).toMatchObject({ draining: false });
    held.release();
  });

  it('removes without drain: aborts running requests and fails them over transparently', async () => {
    const logs: Array<Record<string, unknown>> = [];
    const destination = new Writable({ write: (chunk, _enc, done) => (logs.push(JSON.parse(String(chunk))), done()) });
    const pool = makePool({ logger: createLogger({ level: 'info', destination }) });
    const a = new InMemoryEngineClient();
    const b = new InMemoryEngineClient({ respond: () => ({ tokenIds: [9], logprobs: [-0.5], finishReason: 'stop', text: 'b' }) });
    pool.add(a, { id: 'a', maxConcurrency: 1, model: 'm' });
    pool.add(b, { id: 'b', maxConcurrency: 1, model: 'm', policyVersion: 3 });
    const lease = await pool.acquire('t');
    const out = lease.generate(request());
    await flush();
    expect(a.running).toBe(1);
    await pool.remove('a', { drain: false });
    await expect(out).resolves.toMatchObject({ backendId: 'b', policyVersion: 3, tokenIds: [9] });
    expect(lease.failovers).toBe(1);
    expect(pool.list()).toMatchObject([{ id: 'b', inflightTrajectories: 1, inflightRequests: 0 }]);
    expect(pool.stats().failovers).toBe(1);
    expect(logs.find((l) => l.msg === 'trajectory failed over')).toMatchObject({ component: 'backend-pool', from: 'a', to: 'b' });
  });

  it('fails a trajectory over on its next turn when its backend turns unhealthy', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient({ respond: () => ({ tokenIds: [1], logprobs: [-1], finishReason: 'stop', text: '' }) }), {
      id: 'a', maxConcurrency: 1, model: 'm' });
    pool.add(new InMemoryEngineClient({ respond: () => ({ tokenIds: [2], logprobs: [-1], finishReason: 'stop', text: '' }) }), {
      id: 'b', maxConcurrency: 1, model: 'm' });
    const lease = await pool.acquire('t');
    expect((await lease.generate(request())).backendId).toBe('a');
    pool.setHealthy('a', false);
    expect((await lease.generate(request())).backendId).toBe('b');
    pool.setHealthy('a', true);
    expect((await lease.generate(request())).backendId).toBe('b');
    expect(pool.list().map((x) => [x.id, x.inflightTrajectories, x.failovers])).toEqual([['a', 0, 1], ['b', 1, 0]]);
  });

  it('waits for a backend when none is eligible, and fails with backend_error after the timeout', async () => {
    const pool = makePool({ acquireTimeoutMs: 50 });
    expect(pool.pick()).toEqual({ type: 'queue', reason: 'no_backends' });
    expect(await codeOf(pool.acquire('late'))).toBe('backend_error');
    const waiting = pool.acquire('t');
    await flush();
    expect(pool.stats().waitingAcquires).toBe(1);
    pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 1, model: 'm' });
    expect((await waiting).backendId).toBe('a');
    pool.setHealthy('a', false);
    expect(pool.pick()).toEqual({ type: 'queue', reason: 'none_eligible' });
    const cancel = new AbortController();
    const cancelled = pool.acquire('c', { signal: cancel.signal });
    cancel.abort();
    expect(await codeOf(cancelled)).toBe('cancelled');
    expect(pool.stats().waitingAcquires).toBe(0);
  });

  it('marks a backend unhealthy after consecutive failed probes and healthy after one success', async () => {
    const { tokenizer } = await loadQwen3();
    const engine = await FakeVllmEngine.start({ tokenizer });
    try {
      const pool = makePool({ healthFailureThreshold: 2, healthIntervalMs: 10, healthTimeoutMs: 500 });
      pool.add(new VllmClient({ url: engine.url, model: engine.model }), { id: 'v', maxConcurrency: 4, model: engine.model });
      engine.setHealthy(false);
      await pool.probeHealth();
      expect(pool.list()[0]!.healthy).toBe(true);
      await pool.probeHealth();
      expect(pool.list()[0]!.healthy).toBe(false);
      engine.setHealthy(true);
      pool.startHealthChecks();
      await expect.poll(() => pool.list()[0]!.healthy, { timeout: 2_000 }).toBe(true);
      pool.stopHealthChecks();
      const lease = await pool.acquire('t');
      const out = await lease.generate({ ...request(), promptIds: tokenizer.encode('<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n') });
      expect(out.backendId).toBe('v');
      expect(engine.requestsServed).toBe(1);
      lease.release();
    } finally {
      await engine.close();
    }
  });

  it('moves a request in flight over real HTTP when its engine is removed without drain', async () => {
    const { tokenizer } = await loadQwen3();
    const slow = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 50 });
    const fast = await FakeVllmEngine.start({ tokenizer });
    try {
      const pool = makePool();
      pool.add(new VllmClient({ url: slow.url, model: slow.model }), { id: 'slow', maxConcurrency: 2, model: slow.model });
      const lease = await pool.acquire('t');
      pool.add(new VllmClient({ url: fast.url, model: fast.model }), { id: 'fast', maxConcurrency: 2, model: fast.model });
      const promptIds = tokenizer.encode('<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n');
      const out = lease.generate({ promptIds, maxTokens: 64, seed: 1, signal: new AbortController().signal });
      await expect.poll(() => slow.stats().inflight).toBe(1);
      await pool.remove('slow', { drain: false });
      await expect(out).resolves.toMatchObject({ backendId: 'fast', finishReason: 'stop' });
      await expect.poll(() => slow.stats().disconnected).toBe(1);
      expect(fast.requestsServed).toBe(1);
      lease.release();
      expect(pool.stats()).toMatchObject({ leases: 0, inflightTrajectories: 0, inflightRequests: 0 });
    } finally {
      await Promise.all([slow.close(), fast.close()]);
    }
  });

  it('rejects duplicate ids and unknown ids with their codes', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 1, model: 'm' });
    expect(() => pool.add(new InMemoryEngineClient(), { id: 'a', maxConcurrency: 1, model: 'm' })).toThrow(
      expect.objectContaining({ code: 'already_exists' }),
    );
    expect(await codeOf(pool.remove('zzz', { drain: false }))).toBe('not_found');
    expect(() => pool.setHealthy('zzz', true)).toThrow(expect.objectContaining({ code: 'not_found' }));
  });
});
