import { Client, credentials, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { PassThrough } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PauseMode } from '../../gen/ts/rollout/v1/backend.js';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { createLogger } from '../../src/observability/logger.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { encodeFields, len, utf8, varint } from '../support/wire-bytes.js';

/**
 * The admin RPCs as an attacker (or a buggy trainer) would call them: wrong tokens, ids that do not exist or went
 * away, policy versions and grace periods no honest caller sends, calls racing each other. Each gets its status by
 * field; none changes anything it should not, and no token reaches the log.
 */
const ADMIN = 'admin-hostile-s3cr3t-token';

/** Raw bytes to an admin method, with `token` (or none): its status code, `rollout-field` trailer and message. */
function rawAdmin(client: Client, path: string, bytes: Uint8Array, token?: string): Promise<{ code: number; field: string; details: string }> {
  const metadata = new Metadata();
  if (token !== undefined) metadata.set('authorization', `Bearer ${token}`);
  return new Promise((resolve) => {
    client.makeUnaryRequest(path, (b: Uint8Array) => Buffer.from(b), (b: Buffer) => b, bytes, metadata, (err: ServiceError | null) =>
      resolve(err ? { code: err.code, field: String(err.metadata.get('rollout-field')[0] ?? ''), details: err.details } : { code: status.OK, field: '', details: '' }),
    );
  });
}

describe('admin RPCs under hostile calls', () => {
  let h: ServerHarness;
  let raw: Client;
  let logs = '';

  beforeAll(async () => {
    const sink = new PassThrough();
    sink.on('data', (chunk: Buffer) => (logs += chunk.toString()));
    h = await startServerHarness({ config: { adminToken: ADMIN }, logger: createLogger({ level: 'debug', destination: sink }) });
    raw = new Client(h.server.address, credentials.createInsecure());
  }, 60_000);
  afterAll(async () => {
    raw?.close();
    await h?.close();
  });

  it('every admin RPC refuses a missing or wrong token (one byte off, a prefix, the token twice) and logs no token', async () => {
    const paths = [
      '/rollout.v1.BackendService/AddBackend',
      '/rollout.v1.BackendService/RemoveBackend',
      '/rollout.v1.BackendService/ListBackends',
      '/rollout.v1.BackendService/PauseGeneration',
      '/rollout.v1.BackendService/ResumeGeneration',
      '/rollout.v1.AdminService/Drain',
      '/rollout.v1.AdminService/GetServerState',
    ];
    const wrong = [undefined, `${ADMIN.slice(0, -1)}X`, ADMIN.slice(0, 8), `${ADMIN}${ADMIN}`, ''];
    for (const path of paths) {
      for (const token of wrong) {
        const got = await rawAdmin(raw, path, new Uint8Array(), token);
        expect(got.code, `${path} with ${String(token)}`).toBe(status.UNAUTHENTICATED);
      }
    }
    expect((await h.client.listBackends()).length).toBe(1);
    expect(h.server.lifecycle.state).toBe('running');
    expect(logs).not.toContain(ADMIN.slice(0, 8));
  });

  it('ResumeGeneration refuses a negative policy version and one past 2^53 by field, changing nothing', async () => {
    const before = (await h.client.listBackends())[0]!.policyVersion;
    for (const version of [-1n, (1n << 63n) - 1n, 1n << 53n]) {
      // int64 on the wire: a negative one is its two's complement as a varint.
      const bytes = encodeFields([varint(2, BigInt.asUintN(64, version))]);
      const got = await rawAdmin(raw, '/rollout.v1.BackendService/ResumeGeneration', bytes, ADMIN);
      expect(got, `policy_version ${version}`).toMatchObject({ code: status.INVALID_ARGUMENT, field: 'policy_version' });
    }
    expect((await h.client.listBackends())[0]!.policyVersion).toBe(before);
  });

  it('Drain refuses a grace period past a day and one past 2^53 by field; the server keeps running', async () => {
    for (const grace of [86_400_001n, (1n << 64n) - 1n]) {
      const got = await rawAdmin(raw, '/rollout.v1.AdminService/Drain', encodeFields([varint(1, grace)]), ADMIN);
      expect(got, `grace_ms ${grace}`).toMatchObject({ code: status.INVALID_ARGUMENT, field: 'grace_ms' });
    }
    expect(h.server.lifecycle.state).toBe('running');
  });

  it('RemoveBackend, PauseGeneration and ResumeGeneration of an unknown id are NOT_FOUND; removing twice is NOT_FOUND the second time', async () => {
    for (const path of ['/rollout.v1.BackendService/RemoveBackend', '/rollout.v1.BackendService/PauseGeneration', '/rollout.v1.BackendService/ResumeGeneration']) {
      const mode = path.endsWith('PauseGeneration') ? [varint(2, BigInt(PauseMode.PAUSE_MODE_ABORT))] : [];
      const got = await rawAdmin(raw, path, encodeFields([len(1, utf8('no-such-engine')), ...mode]), ADMIN);
      expect(got.code, path).toBe(status.NOT_FOUND);
    }
    await h.client.addBackend({ url: 'http://127.0.0.1:9/', id: 'twice', maxConcurrency: 1 });
    const both = await Promise.allSettled([h.client.removeBackend('twice', true), h.client.removeBackend('twice', true)]);
    // Two drains of an idle engine at once: both may answer OK (the second found it draining), or the second NOT_FOUND.
    for (const r of both) if (r.status === 'rejected') expect((r.reason as ServiceError).code).toBe(status.NOT_FOUND);
    const again = (await h.client.removeBackend('twice').catch((e: unknown) => e)) as ServiceError;
    expect(again.code).toBe(status.NOT_FOUND);
    expect((await h.client.listBackends()).map((b) => b.id)).not.toContain('twice');
  });

  it('a pause of a backend racing its removal: both answer, and the engine is not left paused', async () => {
    const engineUrl = h.engine.url;
    await h.client.addBackend({ url: engineUrl, id: 'racing', maxConcurrency: 1 });
    const [paused, removed] = await Promise.allSettled([h.client.pauseGeneration(PauseMode.PAUSE_MODE_ABORT, { backendId: 'racing' }), h.client.removeBackend('racing')]);
    expect(removed.status).toBe('fulfilled');
    if (paused.status === 'rejected') expect([status.NOT_FOUND, status.UNAVAILABLE]).toContain((paused.reason as ServiceError).code);
    expect(h.engine.paused).toBe(false);
    expect((await h.client.listBackends()).map((b) => b.id)).not.toContain('racing');
    // The trainer's client, with the admin token, still works after all this.
    const client = new RolloutClient(h.server.address, { adminToken: ADMIN });
    try {
      expect((await client.listBackends()).length).toBe(1);
    } finally {
      client.close();
    }
  });
});
