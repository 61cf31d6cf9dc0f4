import { describe, expect, it } from 'vitest';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';
import { poolSuite } from '../support/pool-suite.js';

// The prober flips a backend only after `healthFailureThreshold` failed probes in a row, because marking it unhealthy
// moves its trajectories and throws their prefix caches away. Those failures are the backend's own: an engine removed
// and added back under the same id (the default id is its url, so re-adding one to change its max_concurrency does
// exactly that) starts from none, whatever the backend before it under that id had failed.

const suite = poolSuite({ pool: { healthFailureThreshold: 2, healthTimeoutMs: 200 } });

describe('health failures are counted per backend, not per id', () => {
  it('a backend added under the id of a removed one that had failed a probe is not flipped by its own first failure', async () => {
    const pool = suite.makePool();
    const before = new InMemoryEngineClient();
    pool.add(before, { id: 'a', maxConcurrency: 2, model: 'm' });
    before.healthy = false;
    await pool.probeHealth(); // one failure: not yet unhealthy
    expect(pool.list()[0]!.healthy).toBe(true);
    await pool.remove('a', { drain: false });

    const after = new InMemoryEngineClient();
    pool.add(after, { id: 'a', maxConcurrency: 4, model: 'm' });
    after.healthy = false; // one slow or failed probe of its own
    await pool.probeHealth();
    expect(pool.list()[0]!.healthy).toBe(true);
    await pool.probeHealth(); // its second in a row
    expect(pool.list()[0]!.healthy).toBe(false);
  });
});
