import { Client, credentials, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { INFRASTRUCTURE_REQUEST_BYTES } from '../../src/contract/infrastructure-requests.js';
import { encodeFields, len, utf8 } from '../support/wire-bytes.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { within } from '../support/wait.js';

/**
 * grpc.health.v1 and server reflection need no token (load balancers and grpcurl carry none), so anyone who reaches the
 * port sends them what they like. The health library quotes the service name it does not know in its status message:
 * a Check naming a 1 MiB service was answered with a 1 MiB grpc-message trailer, over every client's header list limit,
 * so the call got no status at all (it hung until the client's deadline, or calls.unaryDeadlineMs: an hour, counted in
 * the connection's maxUnaryInFlight); a Watch of such a name held it for as long as the stream stayed open, 1,024
 * streams a connection. Their requests are names: bounded at INFRASTRUCTURE_REQUEST_BYTES, refused by field.
 */
const identity = (b: Uint8Array): Buffer => Buffer.from(b);

describe('health checking and reflection requests, sent by a client with no token', () => {
  let h: ServerHarness;
  let client: Client;
  beforeAll(async () => {
    h = await startServerHarness({ config: { auth: { token: 'review-s39-trainer', adminToken: 'review-s39-admin' } } });
    client = new Client(h.server.address, credentials.createInsecure(), { 'grpc.max_send_message_length': -1 });
  }, 60_000);
  afterAll(async () => {
    client?.close();
    await h?.close();
  });

  const unary = (path: string, bytes: Uint8Array): Promise<{ code: number; details: string; field: unknown }> =>
    new Promise((resolve) => {
      client.makeUnaryRequest(path, identity, (b: Buffer) => b, bytes, new Metadata(), { deadline: Date.now() + 30_000 }, (err: ServiceError | null) =>
        resolve(err ? { code: err.code, details: err.details, field: err.metadata?.get('rollout-field')[0] } : { code: status.OK, details: '', field: undefined }),
      );
    });
  const listen = (call: NodeJS.EventEmitter, resolve: (s: { code: number; details: string }) => void): void => {
    call.on('data', () => undefined);
    call.on('error', () => undefined);
    call.on('status', (s: { code: number; details: string }) => resolve({ code: s.code, details: s.details }));
  };
  const serverStreamStatus = (path: string, bytes: Uint8Array): Promise<{ code: number; details: string }> =>
    new Promise((resolve) => listen(client.makeServerStreamRequest(path, identity, (b: Buffer) => b, bytes, new Metadata(), { deadline: Date.now() + 30_000 }), resolve));
  const bidiStatus = (path: string, bytes: Uint8Array): Promise<{ code: number; details: string }> =>
    new Promise((resolve) => {
      const call = client.makeBidiStreamRequest(path, identity, (b: Buffer) => b, new Metadata(), { deadline: Date.now() + 30_000 });
      listen(call, resolve);
      call.write(bytes);
      call.end();
    });

  it('a Check naming a 1 MiB service is answered INVALID_ARGUMENT naming `service` at once, not left without a status', async () => {
    const got = await within(unary('/grpc.health.v1.Health/Check', encodeFields([len(1, utf8('x'.repeat(1 << 20)))])), 60_000, 'Check');
    expect(got.code).toBe(status.INVALID_ARGUMENT);
    expect(got.field).toBe('service');
    expect(got.details).toContain(`${INFRASTRUCTURE_REQUEST_BYTES}`);
    expect(got.details.length).toBeLessThan(4096);
  });

  it('a Watch of a 1 MiB service name ends INVALID_ARGUMENT instead of holding the name while it stays open', async () => {
    const got = await within(serverStreamStatus('/grpc.health.v1.Health/Watch', encodeFields([len(1, utf8('y'.repeat(1 << 20)))])), 60_000, 'Watch');
    expect(got.code).toBe(status.INVALID_ARGUMENT);
    expect(got.details).toContain('service');
  });

  it('a reflection request asking for a 1 MiB symbol ends INVALID_ARGUMENT naming the field', async () => {
    const got = await within(
      bidiStatus('/grpc.reflection.v1.ServerReflection/ServerReflectionInfo', encodeFields([len(4, utf8('z'.repeat(1 << 20)))])),
      60_000,
      'ServerReflectionInfo',
    );
    expect(got.code).toBe(status.INVALID_ARGUMENT);
    expect(got.details).toContain('file_containing_symbol');
  });

  it('names as long as the bound are answered as before: an unknown service is NOT_FOUND, a known one SERVING', async () => {
    const name = 'n'.repeat(INFRASTRUCTURE_REQUEST_BYTES - 4); // tag and a 2-byte length
    const unknown = await unary('/grpc.health.v1.Health/Check', encodeFields([len(1, utf8(name))]));
    expect(unknown.code).toBe(status.NOT_FOUND);
    const known = await unary('/grpc.health.v1.Health/Check', encodeFields([len(1, utf8('rollout.v1.RolloutService'))]));
    expect(known.code).toBe(status.OK);
  });
});
