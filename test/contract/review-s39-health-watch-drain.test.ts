import { Client, credentials, loadPackageDefinition, Metadata, status, type ChannelCredentials, type ClientDuplexStream, type ClientReadableStream } from '@grpc/grpc-js';
import { loadSync } from '@grpc/proto-loader';
import { getEventListeners } from 'node:events';
import { protoPath } from 'grpc-health-check';
import { describe, expect, it } from 'vitest';
import { startRolloutServer } from '../../src/app.js';
import { silentLogger } from '../../src/observability/logger.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { INFRASTRUCTURE_PROTOS } from '../../src/contract/reflection.js';
import { eventually, within } from '../support/wait.js';

/**
 * A load balancer (Envoy, a grpc-health-probe --watch) keeps a health Watch open; a reflection client may keep its
 * stream open. Every call of our own services ends UNAVAILABLE once the server is drained, but these stayed open: the
 * drain then waited out its close bound for them and cut the connection, so the watcher got NOT_SERVING and then no
 * status at all, and every shutdown took the whole bound. They end like ours now.
 */
type Ctor<T> = new (address: string, credentials: ChannelCredentials) => T;
const healthPkg = loadPackageDefinition(loadSync(protoPath, { enums: String })) as unknown as {
  grpc: { health: { v1: { Health: Ctor<{ watch(request: { service: string }): ClientReadableStream<{ status: string }>; close(): void }> } } };
};
const reflectionPkg = loadPackageDefinition(loadSync(INFRASTRUCTURE_PROTOS[1]!, { keepCase: true })) as unknown as {
  grpc: { reflection: { v1: { ServerReflection: Ctor<{ ServerReflectionInfo(): ClientDuplexStream<object, { list_services_response?: unknown }>; close(): void }> } } };
};

/** Resolves with every status message the call got and the status it ended with. */
function ending(call: NodeJS.EventEmitter, seen: unknown[] = []): Promise<{ seen: unknown[]; code: number; details: string }> {
  call.on('data', (d: unknown) => seen.push(d));
  call.on('error', () => undefined);
  return new Promise((resolve) => call.on('status', (s: { code: number; details: string }) => resolve({ seen, code: s.code, details: s.details })));
}

describe('health Watch and reflection streams open when the server is drained', () => {
  it('see NOT_SERVING, then end UNAVAILABLE with the reason instead of being cut off when the drain gives up waiting for them', async () => {
    const server = await startRolloutServer({ port: 0, backends: [], tokenWorkers: { count: 0 } }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() });
    const health = new healthPkg.grpc.health.v1.Health(server.address, credentials.createInsecure());
    const reflection = new reflectionPkg.grpc.reflection.v1.ServerReflection(server.address, credentials.createInsecure());
    try {
      const watch = health.watch({ service: '' });
      const seen: unknown[] = [];
      const watched = ending(watch, seen);
      const info = reflection.ServerReflectionInfo();
      const reflected = ending(info);
      const listed = new Promise<void>((resolve) => info.once('data', () => resolve()));
      info.write({ list_services: '' });
      await within(listed, 30_000, 'the reflection answer');
      await eventually(() => seen.length > 0, 'the first health status', 30_000);

      const shutdown = server.shutdown();
      const [w, r] = await within(Promise.all([watched, reflected]), 30_000, 'the streams ending');
      expect(w.seen).toEqual([{ status: 'SERVING' }, { status: 'NOT_SERVING' }]);
      expect(w.code).toBe(status.UNAVAILABLE);
      expect(w.details).toContain('shutting down');
      expect(r.code).toBe(status.UNAVAILABLE);
      expect(r.details).toContain('shutting down');
      await within(shutdown, 30_000, 'shutdown');
    } finally {
      health.close();
      reflection.close();
      await server.shutdown();
    }
  }, 60_000);

  it('leave no listener on the server-lifetime signal once they end, refused ones included', async () => {
    const server = await startRolloutServer({ port: 0, backends: [], tokenWorkers: { count: 0 } }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() });
    const health = new healthPkg.grpc.health.v1.Health(server.address, credentials.createInsecure());
    const raw = new Client(server.address, credentials.createInsecure());
    try {
      const before = getEventListeners(server.lifecycle.signal, 'abort').length;
      for (let i = 0; i < 20; i++) {
        const watch = health.watch({ service: `svc-${i}` });
        const ended = ending(watch);
        await within(new Promise((resolve) => watch.once('data', resolve)), 30_000, 'a health status');
        watch.cancel();
        expect((await within(ended, 30_000, 'the cancelled watch')).code).toBe(status.CANCELLED);
        // A string field sent as a varint: refused INVALID_ARGUMENT inside the handler.
        const refused = ending(raw.makeServerStreamRequest('/grpc.health.v1.Health/Watch', (b: Buffer) => b, (b: Buffer) => b, Buffer.from([0x08, 0x05]), new Metadata()));
        expect((await within(refused, 30_000, 'the refused watch')).code).toBe(status.INVALID_ARGUMENT);
      }
      await eventually(() => getEventListeners(server.lifecycle.signal, 'abort').length === before, 'the listeners of ended calls to go');
    } finally {
      health.close();
      raw.close();
      await server.shutdown();
    }
  }, 60_000);
});
