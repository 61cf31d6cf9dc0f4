import { credentials, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { AdminServiceClient } from '../../gen/ts/rollout/v1/admin.js';
import { startServerHarness } from '../support/server-harness.js';

/**
 * The top-level `adminToken` key is "the same as auth.adminToken" (config.ts) and guards the admin services; the
 * metrics endpoint, which needs the admin token whenever one is configured, read auth.adminToken and auth.token only:
 * a server given its admin token that way served /metrics (engines, sessions, load) to anyone who reached the port.
 */
const TOKEN = 'review-s39-legacy-admin-token';

describe('a server whose admin token is given as the top-level adminToken key', () => {
  it('asks it of a metrics scraper as it does of an admin client', async () => {
    const h = await startServerHarness({ config: { metrics: { port: 0 }, adminToken: TOKEN } });
    const admin = new AdminServiceClient(h.server.address, credentials.createInsecure());
    try {
      const state = (metadata: Metadata): Promise<ServiceError | null> => new Promise((resolve) => admin.getServerState({}, metadata, (err) => resolve(err)));
      const bearer = new Metadata();
      bearer.set('authorization', `Bearer ${TOKEN}`);
      expect((await state(new Metadata()))?.code).toBe(status.UNAUTHENTICATED);
      expect(await state(bearer)).toBeNull();

      const url = `http://${h.server.metrics!.address}/metrics`;
      expect((await fetch(url)).status).toBe(401);
      expect((await fetch(url, { headers: { authorization: 'Bearer wrong' } })).status).toBe(401);
      const scraped = await fetch(url, { headers: { authorization: `Bearer ${TOKEN}` } });
      expect(scraped.status).toBe(200);
      expect(await scraped.text()).toContain('rollout_sessions');
    } finally {
      admin.close();
      await h.close();
    }
  }, 60_000);
});
