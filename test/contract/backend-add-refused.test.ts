import { status, type ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { EngineClient } from '../../src/backends/types.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

/**
 * An AddBackend refused as ALREADY_EXISTS must leave nothing behind: the engine client built for it (its connection
 * pool; for an engine kind that loads its model on construction, the model) is closed, not left to whoever holds it.
 */
describe('AddBackend refused as ALREADY_EXISTS', () => {
  let h: ServerHarness;

  beforeAll(async () => {
    h = await startServerHarness({ config: { adminToken: 'refused-add-admin' } });
  }, 60_000);
  afterAll(async () => h?.close());

  it('closes every engine client the pool refused, and leaves no socket, timer or handle per refused call', async () => {
    await h.client.addBackend({ url: 'http://127.0.0.1:9/', id: 'taken', maxConcurrency: 1 });
    // The pool is the seam: each client AddBackend hands it is recorded, with whether it was closed.
    const pool = h.server.pool;
    const handed: { client: EngineClient; closed: boolean }[] = [];
    const add = pool.add.bind(pool);
    const spy = vi.spyOn(pool, 'add').mockImplementation((client, options) => {
      const entry = { client, closed: false };
      handed.push(entry);
      const close = client.close?.bind(client);
      client.close = () => {
        entry.closed = true;
        close?.();
      };
      return add(client, options);
    });
    const before = process.getActiveResourcesInfo().length;
    try {
      for (let i = 0; i < 20; i++) {
        const err = (await h.client.addBackend({ url: 'http://127.0.0.1:9/', id: 'taken', maxConcurrency: 1 }).catch((e: unknown) => e)) as ServiceError;
        expect(err.code).toBe(status.ALREADY_EXISTS);
        expect(err.details).toContain('taken');
      }
    } finally {
      spy.mockRestore();
    }
    // Either no client was built for a refused call, or each one built was closed.
    expect(handed.filter((e) => !e.closed)).toEqual([]);
    expect(process.getActiveResourcesInfo().length).toBeLessThanOrEqual(before);
    expect((await h.client.listBackends()).filter((b) => b.id === 'taken')).toHaveLength(1);
    await h.client.removeBackend('taken');
  });
});
