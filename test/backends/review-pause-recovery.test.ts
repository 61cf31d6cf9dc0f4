import { describe, expect, it } from 'vitest';
import type { PauseMode } from '../../src/backends/types.js';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';
import type { BackendPoolOptions } from '../../src/backends/pool.js';
import { poolSuite } from '../support/pool-suite.js';

// An engine that was down at a pool-wide resume is resumed when it answers again (resumePending). That promise
// belongs to that resume only: a pool-wide pause that began since (the next weight sync, the engine still down) wants
// the engine paused, and its recovery must not resume it and open its gate while the weights are being replaced.

const suite = poolSuite({ pool: { acquireTimeoutMs: 500, healthTimeoutMs: 500 } });

/** The in-memory double with pause and resume calls that answer at once, or refuse while it is down. */
class Engine extends InMemoryEngineClient {
  paused = false;
  resumeCalls = 0;
  pause(_mode: PauseMode): Promise<void> {
    if (!this.healthy) return Promise.reject(new Error('connection refused'));
    this.paused = true;
    return Promise.resolve();
  }
  resume(): Promise<void> {
    this.resumeCalls++;
    if (!this.healthy) return Promise.reject(new Error('connection refused'));
    this.paused = false;
    return Promise.resolve();
  }
}

const flush = async (): Promise<void> => {
  for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
};

async function downAfterAPause(options: BackendPoolOptions): Promise<{ pool: ReturnType<typeof suite.makePool>; engine: Engine }> {
  const engine = new Engine();
  const pool = suite.makePool(options);
  pool.add(engine, { id: 'a', maxConcurrency: 2, model: 'm' });
  await pool.pause('abort');
  engine.healthy = false;
  await pool.probeHealth();
  await pool.probeHealth();
  expect(pool.list()[0]).toMatchObject({ healthy: false, paused: true });
  return { pool, engine };
}

describe('an engine down across two weight syncs', () => {
  for (const [name, options, version] of [
    ['at version 0', {}, undefined],
    ['with holdRecoveredBackends off', { holdRecoveredBackends: false }, 3],
  ] as const) {
    it(`${name}: recovering during the second pool-wide pause leaves it paused until that pause's resume`, async () => {
      const { pool, engine } = await downAfterAPause(options);
      await pool.resume(version === undefined ? {} : { policyVersion: version }); // down: its engine is resumed on recovery…
      await pool.pause('abort'); // …unless the next weight sync began meanwhile
      expect(pool.weights.paused).toBe(true);
      engine.healthy = true;
      await pool.probeHealth();
      await flush();
      await pool.probeHealth();
      await flush();
      // The second pause is still in effect: no request may reach the engine while its weights are replaced.
      expect({ gateClosed: pool.list()[0]!.paused, enginePaused: engine.paused }).toEqual({ gateClosed: true, enginePaused: true });
      await pool.resume({ policyVersion: 4 });
      expect({ gateClosed: pool.list()[0]!.paused, enginePaused: engine.paused, policyVersion: pool.list()[0]!.policyVersion }).toEqual({
        gateClosed: false,
        enginePaused: false,
        policyVersion: 4,
      });
    });
  }
});

/** An engine whose resume calls wait for the test to answer them (`parked`), while `parkResumes` is set. */
class ParkingEngine extends Engine {
  parkResumes = false;
  readonly parked: { succeed: () => void; fail: (err: Error) => void }[] = [];
  override resume(): Promise<void> {
    if (!this.parkResumes) return super.resume();
    this.resumeCalls++;
    return new Promise<void>((resolve, reject) => {
      this.parked.push({
        succeed: () => {
          this.paused = false;
          resolve();
        },
        fail: reject,
      });
    });
  }
}

describe('a recovered engine whose resume fails while the next pause begins', () => {
  it('is not resumed by a later probe while that pause is in effect', async () => {
    const engine = new ParkingEngine();
    const pool = suite.makePool({ holdRecoveredBackends: false });
    pool.add(engine, { id: 'a', maxConcurrency: 2, model: 'm' });
    await pool.pause('abort');
    engine.healthy = false;
    await pool.probeHealth();
    await pool.probeHealth();
    await pool.resume({ policyVersion: 1 }); // down: resumed when it recovers
    engine.healthy = true;
    engine.parkResumes = true;
    await pool.probeHealth(); // recovered: its resume goes out…
    await expect.poll(() => engine.parked.length).toBe(1);
    const pausing = pool.pause('abort'); // …and the next weight sync begins before it answers
    await flush();
    engine.parked[0]!.fail(new Error('connection reset')); // the recovery's resume fails
    engine.parkResumes = false;
    await pausing;
    expect(engine.paused).toBe(true);
    await pool.probeHealth(); // a later probe must not take up that recovery's resume again
    await flush();
    expect({ gateClosed: pool.list()[0]!.paused, enginePaused: engine.paused }).toEqual({ gateClosed: true, enginePaused: true });
    await pool.resume({ policyVersion: 2 });
    expect({ gateClosed: pool.list()[0]!.paused, enginePaused: engine.paused }).toEqual({ gateClosed: false, enginePaused: false });
  });
});
