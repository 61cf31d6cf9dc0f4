import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import type { EngineServerInfo, GenerateRequest } from '../../src/backends/types.js';
import { RolloutError } from '../../src/errors.js';
import { createLogger } from '../../src/observability/logger.js';
import { trajectoryLogprobsMode } from '../../src/pipeline/trajectory.js';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';
import { poolSuite } from '../support/pool-suite.js';

/** What the pool learns from engines about themselves — capacity and logprobs mode — and what it does with it. */

const makePool = poolSuite({ pool: { acquireTimeoutMs: 1_000 } }).makePool;

const flush = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));
const request = (overrides: Partial<GenerateRequest> = {}): GenerateRequest => ({ promptIds: [1, 2], maxTokens: 4, signal: new AbortController().signal, ...overrides });

function deferred<T>(): { promise: Promise<T>; resolve: (value: T) => void; reject: (err: unknown) => void } {
  let resolve!: (value: T) => void;
  let reject!: (err: unknown) => void;
  const promise = new Promise<T>((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
}

function capturingLogger(): { logger: ReturnType<typeof createLogger>; logs: Array<Record<string, unknown>> } {
  const logs: Array<Record<string, unknown>> = [];
  const destination = new Writable({ write: (chunk, _enc, done) => (logs.push(JSON.parse(String(chunk)) as Record<string, unknown>), done()) });
  return { logger: createLogger({ level: 'info', destination }), logs };
}

describe('BackendPool capacity', () => {
  it('takes the capacity the engine reports when none is configured, and says where it came from', async () => {
    const pool = makePool({ defaultMaxConcurrency: 7 });
    const added = pool.add(new InMemoryEngineClient({ serverInfo: { maxConcurrency: 3 } }), { id: 'a', model: 'm' });
    expect(added).toMatchObject({ maxConcurrency: 7, capacitySource: 'default' });
    expect(await pool.learn('a')).toMatchObject({ maxConcurrency: 3, capacitySource: 'engine' });
  });

  it('keeps a configured capacity whatever the engine reports', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient({ serverInfo: { maxConcurrency: 3 } }), { id: 'a', model: 'm', maxConcurrency: 5 });
    expect(await pool.learn('a')).toMatchObject({ maxConcurrency: 5, capacitySource: 'configured' });
  });

  it('stays at the default when the engine does not say, and asks an unreachable engine again after a good probe', async () => {
    const pool = makePool({ defaultMaxConcurrency: 7 });
    pool.add(new InMemoryEngineClient({ serverInfo: { note: 'GET /server_info answered HTTP 404' } }), { id: 'silent', model: 'm' });
    expect(await pool.learn('silent')).toMatchObject({ maxConcurrency: 7, capacitySource: 'default' });

    let reachable = false;
    let asked = 0;
    const flaky = new InMemoryEngineClient({
      serverInfo: () => {
        asked++;
        return reachable ? Promise.resolve({ maxConcurrency: 2 }) : Promise.reject(new RolloutError('backend_error', 'connection refused'));
      },
    });
    pool.add(flaky, { id: 'flaky', model: 'm' });
    expect(await pool.learn('flaky')).toMatchObject({ maxConcurrency: 7, capacitySource: 'default' });
    reachable = true;
    await pool.probeHealth();
    await flush();
    expect(await pool.learn('flaky')).toMatchObject({ maxConcurrency: 2, capacitySource: 'engine' });
    const before = asked;
    await pool.probeHealth();
    await pool.learn('flaky');
    expect(asked).toBe(before); // known now: not asked again
  });

  it('admits queued requests at once when the learned capacity is larger, and routes by it', async () => {
    const info = deferred<EngineServerInfo>();
    const engine = new InMemoryEngineClient({ serverInfo: () => info.promise });
    const pool = makePool({ defaultMaxConcurrency: 1 });
    pool.add(engine, { id: 'a', model: 'm' });
    const leases = await Promise.all([0, 1, 2].map((i) => pool.acquire(`t${i}`)));
    const results = leases.map((l) => l.generate(request()));
    await flush();
    expect(engine.running).toBe(1);
    info.resolve({ maxConcurrency: 3 });
    await pool.learn('a');
    await flush();
    expect(engine.running).toBe(3);
    expect(pool.list()[0]).toMatchObject({ maxConcurrency: 3, inflightRequests: 3, queuedRequests: 0 });
    // A second engine of configured capacity 1 next to it: the weighted key now sees 3 slots on `a`.
    pool.add(new InMemoryEngineClient(), { id: 'b', model: 'm', maxConcurrency: 1 });
    expect(pool.pick()).toMatchObject({ type: 'pick', backend: { id: 'b' } }); // (0+1)/1 < (3+0+1)/3
    while (engine.pending.length > 0) engine.pending[0]!.resolve();
    await Promise.all(results);
  });
});

describe('BackendPool logprobs mode', () => {
  it('records the declared mode, the reported one, or none, and every lease result carries it', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient({ respond: () => ({ tokenIds: [1], logprobs: [-1], finishReason: 'stop', text: '' }) }), { id: 'declared', model: 'm', logprobsMode: 'raw' });
    pool.add(new InMemoryEngineClient({ serverInfo: { logprobsMode: 'processed' } }), { id: 'reported', model: 'm' });
    pool.add(new InMemoryEngineClient(), { id: 'unknown', model: 'm' });
    await Promise.all(['declared', 'reported', 'unknown'].map((id) => pool.learn(id)));
    expect(Object.fromEntries(pool.list().map((b) => [b.id, b.logprobsMode]))).toEqual({ declared: 'raw', reported: 'processed', unknown: undefined });
    const lease = await pool.acquire('t');
    expect(lease.backendId).toBe('declared');
    expect((await lease.generate(request())).logprobsMode).toBe('raw');
  });

  it('refuses a declared mode the engine contradicts (invalid_argument, field logprobs_mode) and an engine reporting logits', async () => {
    const pool = makePool();
    pool.add(new InMemoryEngineClient({ serverInfo: { logprobsMode: 'processed' } }), { id: 'agrees', model: 'm', logprobsMode: 'processed' });
    pool.add(new InMemoryEngineClient({ serverInfo: { logprobsMode: 'processed' } }), { id: 'contradicts', model: 'm', logprobsMode: 'raw' });
    pool.add(new InMemoryEngineClient({ serverInfo: { unsupportedLogprobsMode: 'raw_logits' } }), { id: 'logits', model: 'm' });
    pool.add(new InMemoryEngineClient({ serverInfo: {} }), { id: 'silent', model: 'm', logprobsMode: 'raw' });
    await Promise.all(['agrees', 'contradicts', 'logits', 'silent'].map((id) => pool.learn(id)));
    expect(() => pool.checkEngineAgrees('agrees')).not.toThrow();
    expect(() => pool.checkEngineAgrees('silent')).not.toThrow();
    expect(() => pool.checkEngineAgrees('contradicts')).toThrow(expect.objectContaining({ code: 'invalid_argument', field: 'logprobs_mode' }));
    expect(() => pool.checkEngineAgrees('logits')).toThrow(expect.objectContaining({ code: 'failed_precondition', message: expect.stringContaining('raw_logits') as unknown }));
    // Were it kept anyway, the record holds what the engine reports, not the declaration.
    expect(pool.list().find((b) => b.id === 'contradicts')!.logprobsMode).toBe('processed');
  });

  it('makes a trajectory that failed over from a raw engine to a processed one MIXED', async () => {
    const pool = makePool();
    const raw = new InMemoryEngineClient();
    pool.add(raw, { id: 'raw', model: 'm', maxConcurrency: 4, logprobsMode: 'raw' });
    pool.add(new InMemoryEngineClient({ respond: () => ({ tokenIds: [2], logprobs: [-1], finishReason: 'stop', text: '' }) }), { id: 'processed', model: 'm', maxConcurrency: 1, logprobsMode: 'processed' });
    const lease = await pool.acquire('t');
    expect(lease.backendId).toBe('raw');
    const first = lease.generate(request());
    await flush();
    raw.pending[0]!.resolve();
    const a = await first;
    pool.setHealthy('raw', false);
    const b = await lease.generate(request());
    expect([a.logprobsMode, b.logprobsMode]).toEqual(['raw', 'processed']);
    const turn = (logprobsMode: 'raw' | 'processed' | undefined) => ({ role: 'assistant' as const, start: 0, end: 1, ...(logprobsMode && { logprobsMode }) });
    expect(trajectoryLogprobsMode([turn(a.logprobsMode), turn(b.logprobsMode)])).toBe('mixed');
    expect(trajectoryLogprobsMode([turn('processed'), turn('processed')])).toBe('processed');
    expect(trajectoryLogprobsMode([turn('processed'), turn(undefined)])).toBeUndefined();
    expect(trajectoryLogprobsMode([])).toBeUndefined();
  });

  it('warns once per backend when its logprobs are not the sampling distribution of the requests it gets', async () => {
    const { logger, logs } = capturingLogger();
    const pool = makePool({ logger });
    const answer = () => ({ tokenIds: [1], logprobs: [-1], finishReason: 'stop' as const, text: '' });
    pool.add(new InMemoryEngineClient({ respond: answer }), { id: 'raw', model: 'm', maxConcurrency: 4, logprobsMode: 'raw' });
    pool.add(new InMemoryEngineClient({ respond: answer }), { id: 'processed', model: 'm', maxConcurrency: 4, logprobsMode: 'processed' });
    const leases = await Promise.all([0, 1, 2, 3].map((i) => pool.acquire(`t${i}`)));
    for (const lease of leases) for (let turn = 0; turn < 3; turn++) await lease.generate(request({ temperature: 0.7 }));
    const warnings = logs.filter((l) => typeof l.msg === 'string' && l.msg.includes('PPO-style ratios would be off'));
    expect(warnings.map((w) => w.backend)).toEqual(['raw']);
    expect(warnings[0]!.msg).toMatch(/temperature 0.7/);
  });
});
