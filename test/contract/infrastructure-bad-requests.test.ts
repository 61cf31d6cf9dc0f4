import { Client, credentials, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeFields, len, utf8, varint } from '../support/wire-bytes.js';
import { startHarness, type Harness } from '../support/harness.js';

/**
 * grpc.health.v1 and server reflection answer requests whose bytes do not decode as their project's own services do:
 * INVALID_ARGUMENT saying why (a load balancer or grpcurl sending garbage made a mistake; the server did not fail),
 * never INTERNAL. And the server goes on answering good requests.
 */

const GARBAGE: readonly (readonly [string, Uint8Array])[] = [
  ['a length past the end', Uint8Array.of(0x0a, 0x40, 0x41)],
  ['a string field sent as a varint', encodeFields([varint(1, 5n)])],
  ['a truncated varint', Uint8Array.of(0x08, 0xff)],
  ['a group never ended', Uint8Array.of(0x0b)],
];

const identity = (b: Uint8Array): Buffer => Buffer.from(b);

function unary(client: Client, path: string, bytes: Uint8Array): Promise<{ code: number; details: string }> {
  return new Promise((resolve) => {
    client.makeUnaryRequest(path, identity, (b: Buffer) => b, bytes, new Metadata(), (err: ServiceError | null) =>
      resolve(err ? { code: err.code, details: err.details } : { code: status.OK, details: '' }),
    );
  });
}

/** The status a streaming call ends with (server stream, or bidi with `bytes` as its one message). */
function streamStatus(client: Client, path: string, bytes: Uint8Array, bidi: boolean): Promise<{ code: number; details: string }> {
  return new Promise((resolve) => {
    const listen = (call: NodeJS.EventEmitter): void => {
      call.on('data', () => undefined);
      call.on('error', () => undefined);
      call.on('status', (s: { code: number; details: string }) => resolve({ code: s.code, details: s.details }));
    };
    if (!bidi) return listen(client.makeServerStreamRequest(path, identity, (b: Buffer) => b, bytes, new Metadata()));
    const call = client.makeBidiStreamRequest(path, identity, (b: Buffer) => b, new Metadata());
    listen(call);
    call.write(bytes);
    call.end();
  });
}

describe('health checking and reflection refuse undecodable requests', () => {
  let h: Harness;
  let client: Client;
  beforeAll(async () => {
    h = await startHarness();
    client = new Client(h.server.address, credentials.createInsecure());
  });
  afterAll(async () => {
    client?.close();
    await h?.close();
  });

  it('Health.Check and Health.List answer INVALID_ARGUMENT, and a good Check is still SERVING', async () => {
    for (const [what, bytes] of GARBAGE) {
      // HealthListRequest has no fields: a varint field 1 is an unknown field there, which is fine.
      const paths = what === 'a string field sent as a varint' ? ['/grpc.health.v1.Health/Check'] : ['/grpc.health.v1.Health/Check', '/grpc.health.v1.Health/List'];
      for (const path of paths) {
        const got = await unary(client, path, bytes);
        expect(got.code, `${path}: ${what}`).toBe(status.INVALID_ARGUMENT);
        expect(got.details, `${path}: ${what}`).toMatch(/grpc\.health\.v1\.Health(Check|List)Request/);
      }
    }
    const good = await unary(client, '/grpc.health.v1.Health/Check', encodeFields([len(1, utf8('rollout.v1.RolloutService'))]));
    expect(good.code).toBe(status.OK);
  });

  it('Health.Watch ends INVALID_ARGUMENT', async () => {
    for (const [what, bytes] of GARBAGE) {
      const got = await streamStatus(client, '/grpc.health.v1.Health/Watch', bytes, false);
      expect(got.code, what).toBe(status.INVALID_ARGUMENT);
    }
  });

  it('ServerReflectionInfo (v1 and v1alpha) ends INVALID_ARGUMENT', async () => {
    for (const [what, bytes] of GARBAGE) {
      for (const path of ['/grpc.reflection.v1.ServerReflection/ServerReflectionInfo', '/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo']) {
        const got = await streamStatus(client, path, bytes, true);
        expect(got.code, `${path}: ${what}`).toBe(status.INVALID_ARGUMENT);
        expect(got.details, `${path}: ${what}`).toContain('ServerReflectionRequest');
      }
    }
    // A good request on a new stream is answered (list_services = 7).
    const listed = await new Promise<number>((resolve) => {
      const call = client.makeBidiStreamRequest('/grpc.reflection.v1.ServerReflection/ServerReflectionInfo', identity, (b: Buffer) => b, new Metadata());
      let answers = 0;
      call.on('data', () => answers++);
      call.on('status', () => resolve(answers));
      call.write(encodeFields([len(7, utf8(''))]));
      call.end();
    });
    expect(listed).toBe(1);
  });
});
