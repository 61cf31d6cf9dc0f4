import { describe, expect, it } from 'vitest';
import { BackendPool } from '../../src/backends/pool.js';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';

/** An engine double whose health answer the test gives (a probe in flight while the operator replaces the backend). */
class HeldHealthEngine extends InMemoryEngineClient {
  answer: (healthy: boolean) => void = () => undefined;
  asked!: Promise<void>;
  #asked!: () => void;
  constructor() {
    super();
    this.asked = new Promise((resolve) => (this.#asked = resolve));
  }
  override health(): Promise<boolean> {
    this.#asked();
    return new Promise((resolve) => (this.answer = resolve));
  }
}

/**
 * A backend id can be removed and given to another engine (an operator replacing a dead engine under the same id):
 * what was under way for the removed one must not land on its successor.
 */
describe('a backend id removed and added again', () => {
  it('a health probe of the removed engine that fails after the new one was added leaves the new one healthy', async () => {
    const pool = new BackendPool({ healthFailureThreshold: 1, healthIntervalMs: 3_600_000 });
    try {
      const old = new HeldHealthEngine();
      pool.add(old, { id: 'gpu-1', model: 'm', maxConcurrency: 1, maxModelLen: 4096 });
      const probing = pool.probeHealth();
      await old.asked;
      await pool.remove('gpu-1', { drain: false });
      pool.add(new InMemoryEngineClient(), { id: 'gpu-1', model: 'm', maxConcurrency: 1, maxModelLen: 4096 });
      // The removed engine's probe now fails (it was dead: why it was replaced).
      old.answer(false);
      await probing;
      expect(pool.list().map((b) => ({ id: b.id, healthy: b.healthy }))).toEqual([{ id: 'gpu-1', healthy: true }]);
      expect(pool.stats().eligible).toBe(1);
    } finally {
      pool.close();
    }
  });
});
