import { Client, credentials, loadPackageDefinition, Metadata, status, type ChannelCredentials, type ClientDuplexStream, type ClientReadableStream } from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { protoPath } from 'grpc-health-check';
import { afterEach, describe, expect, it } from 'vitest';
import { startRolloutServer, type RolloutServer } from '../../src/app.js';
import { silentLogger } from '../../src/observability/logger.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { INFRASTRUCTURE_PROTOS } from '../../src/contract/reflection.js';
import { within } from '../support/wait.js';

/**
 * Health Watch and reflection streams are answered without a token. Before, nothing bounded how many were open: a
 * client could hold 1,024 on each of as many connections as it opened (each an HTTP/2 stream and its handler's
 * state). Now `calls.maxOpenInfrastructureStreams` (256) bounds them server-wide: one more is RESOURCE_EXHAUSTED naming
 * the key, the unary Check still answers, and a stream that ends (cancelled, finished, refused) gives its place back.
 */
type Ctor<T> = new (address: string, credentials: ChannelCredentials) => T;
interface HealthClient {
  watch(request: { service: string }): ClientReadableStream<{ status: string }>;
  check(request: { service: string }, callback: (err: Error | null, res?: { status: string }) => void): void;
  close(): void;
}
const healthPkg = loadPackageDefinition(loadSync(protoPath, { enums: String })) as unknown as { grpc: { health: { v1: { Health: Ctor<HealthClient> } } } };
const reflectionPkg = loadPackageDefinition(loadSync(INFRASTRUCTURE_PROTOS[1]!, { keepCase: true })) as unknown as {
  grpc: { reflection: { v1: { ServerReflection: Ctor<{ ServerReflectionInfo(): ClientDuplexStream<object, { list_services_response?: unknown }>; close(): void }> } } };
};

/** The first message of a stream, or its status when it ended first. */
function firstOf(call: NodeJS.EventEmitter): Promise<{ data: unknown } | { code: number; details: string }> {
  call.on('error', () => undefined);
  return new Promise((resolve) => {
    call.once('data', (data: unknown) => resolve({ data }));
    call.once('status', (s: { code: number; details: string }) => resolve({ code: s.code, details: s.details }));
  });
}

/** The status a stream ends with. */
function statusOf(call: NodeJS.EventEmitter): Promise<{ code: number; details: string }> {
  call.on('error', () => undefined);
  call.on('data', () => undefined);
  return new Promise((resolve) => call.once('status', (s: { code: number; details: string }) => resolve({ code: s.code, details: s.details })));
}

describe('health Watch and reflection streams open at once (calls.maxOpenInfrastructureStreams)', () => {
  let server: RolloutServer | undefined;
  const clients: { close(): void }[] = [];
  afterEach(async () => {
    for (const c of clients.splice(0)) c.close();
    await server?.shutdown();
    server = undefined;
  });

  async function start(calls?: { maxOpenInfrastructureStreams: number }): Promise<{ health: HealthClient; reflection: InstanceType<typeof reflectionPkg.grpc.reflection.v1.ServerReflection>; raw: Client }> {
    server = await startRolloutServer({ port: 0, backends: [], tokenWorkers: { count: 0 }, ...(calls && { calls }) }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() });
    const health = new healthPkg.grpc.health.v1.Health(server.address, credentials.createInsecure());
    const reflection = new reflectionPkg.grpc.reflection.v1.ServerReflection(server.address, credentials.createInsecure());
    const raw = new Client(server.address, credentials.createInsecure());
    clients.push(health, reflection, raw);
    return { health, reflection, raw };
  }

  it('past the bound one more is RESOURCE_EXHAUSTED naming the key; Check still answers; ended streams (cancelled, finished, refused) give their place back', async () => {
    const { health, reflection, raw } = await start({ maxOpenInfrastructureStreams: 3 });
    const watches = [health.watch({ service: '' }), health.watch({ service: '' })];
    for (const w of watches) expect(await within(firstOf(w), 30_000, 'a health status')).toEqual({ data: { status: 'SERVING' } });
    const info = reflection.ServerReflectionInfo();
    const listed = firstOf(info);
    info.write({ list_services: '' });
    expect(await within(listed, 30_000, 'the reflection answer')).toHaveProperty('data');

    // Three open: a fourth of either kind is refused.
    const refused = await within(firstOf(health.watch({ service: '' })), 30_000, 'the fourth stream');
    expect(refused).toMatchObject({ code: status.RESOURCE_EXHAUSTED });
    expect((refused as { details: string }).details).toContain('calls.maxOpenInfrastructureStreams');
    const refusedReflection = reflection.ServerReflectionInfo();
    const r = firstOf(refusedReflection);
    refusedReflection.write({ list_services: '' });
    expect(await within(r, 30_000, 'the refused reflection stream')).toMatchObject({ code: status.RESOURCE_EXHAUSTED });
    // The unary Check is not a stream: still answered.
    const checked = await within(new Promise<{ status: string } | undefined>((resolve, reject) => health.check({ service: '' }, (err, res) => (err ? reject(err) : resolve(res)))), 30_000, 'Check');
    expect(checked).toEqual({ status: 'SERVING' });

    // A cancelled watch gives its place back.
    const cancelled = statusOf(watches[0]!);
    watches[0]!.cancel();
    expect((await within(cancelled, 30_000, 'the cancel')).code).toBe(status.CANCELLED);
    const again = health.watch({ service: '' });
    expect(await within(firstOf(again), 30_000, 'a watch after the cancel')).toEqual({ data: { status: 'SERVING' } });

    // A reflection stream the client half-closes ends (finished): its place too.
    const finished = statusOf(info);
    info.end();
    expect((await within(finished, 30_000, 'the reflection stream to finish')).code).toBe(status.OK);
    // Refused requests (a string field sent as a varint) end INVALID_ARGUMENT and give their place back, however many.
    for (let i = 0; i < 10; i++) {
      const bad = statusOf(raw.makeServerStreamRequest('/grpc.health.v1.Health/Watch', (b: Buffer) => b, (b: Buffer) => b, Buffer.from([0x08, 0x05]), new Metadata()));
      expect((await within(bad, 30_000, 'the refused watch')).code).toBe(status.INVALID_ARGUMENT);
    }
    const last = health.watch({ service: '' });
    expect(await within(firstOf(last), 30_000, 'a watch in the freed place')).toEqual({ data: { status: 'SERVING' } });
    expect(await within(firstOf(health.watch({ service: '' })), 30_000, 'one more')).toMatchObject({ code: status.RESOURCE_EXHAUSTED });
  }, 60_000);

  it('the default bound is 256: the 257th watch is refused', async () => {
    const { health } = await start();
    const watches = Array.from({ length: 256 }, () => health.watch({ service: '' }));
    const firsts = await within(Promise.all(watches.map(firstOf)), 30_000, '256 health statuses');
    expect(firsts.every((f) => 'data' in f)).toBe(true);
    expect(await within(firstOf(health.watch({ service: '' })), 30_000, 'the 257th')).toMatchObject({ code: status.RESOURCE_EXHAUSTED });
  }, 60_000);

  it('0 refuses every stream and still answers Check', async () => {
    const { health } = await start({ maxOpenInfrastructureStreams: 0 });
    expect(await within(firstOf(health.watch({ service: '' })), 30_000, 'the watch')).toMatchObject({ code: status.RESOURCE_EXHAUSTED });
    const checked = await within(new Promise<{ status: string } | undefined>((resolve, reject) => health.check({ service: '' }, (err, res) => (err ? reject(err) : resolve(res)))), 30_000, 'Check');
    expect(checked).toEqual({ status: 'SERVING' });
  }, 60_000);
});
