import { describe, expect, it } from 'vitest';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';
import { poolSuite } from '../support/pool-suite.js';

// BackendPool.pick() ("what acquire would choose now") read the routing heap alone, while acquire passes over a paused
// engine, or one held by a busy answer's Retry-After, for a ready one: pick() named the paused or held engine where
// acquire placed the trajectory elsewhere. It now says what acquire does. The engines are the in-memory double.

const suite = poolSuite({ pool: { acquireTimeoutMs: 1_000 } });

describe('BackendPool.pick() beside a paused or held engine', () => {
  it('names the ready engine acquire would place a trajectory on, not the paused least-loaded one', async () => {
    const pool = suite.makePool();
    // By load alone "big" (8 slots) is the pick.
    pool.add(new InMemoryEngineClient({ url: 'memory://big' }), { id: 'big', maxConcurrency: 8, model: 'm' });
    pool.add(new InMemoryEngineClient({ url: 'memory://small' }), { id: 'small', maxConcurrency: 1, model: 'm' });
    expect(pool.pick()).toMatchObject({ type: 'pick', backend: { id: 'big' } });
    await pool.pause('wait', { id: 'big' });
    expect(pool.pick()).toMatchObject({ type: 'pick', backend: { id: 'small' } });
    const lease = await pool.acquire('t');
    expect(lease.backendId).toBe('small');
    lease.release();
  });

  it('names the paused engine when every engine is paused (acquire places the trajectory there to wait)', async () => {
    const pool = suite.makePool();
    pool.add(new InMemoryEngineClient({ url: 'memory://big' }), { id: 'big', maxConcurrency: 8, model: 'm' });
    pool.add(new InMemoryEngineClient({ url: 'memory://small' }), { id: 'small', maxConcurrency: 1, model: 'm' });
    await pool.pause('wait');
    expect(pool.pick()).toMatchObject({ type: 'pick', backend: { id: 'big' } });
    const lease = await pool.acquire('t');
    expect(lease.backendId).toBe('big');
    lease.release();
  });
});
