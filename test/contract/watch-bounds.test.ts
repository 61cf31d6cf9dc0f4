import { credentials, Metadata, status, type ClientReadableStream, type ServiceError } from '@grpc/grpc-js';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startRolloutServer, type RolloutServer } from '../../src/app.js';
import { silentLogger } from '../../src/observability/logger.js';
import type { Sample } from '../../src/pipeline/sample.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { AddBackendRequest, BackendServiceClient } from '../../gen/ts/rollout/v1/backend.js';
import { RolloutServiceClient, WatchRequest, WatchResponse } from '../../gen/ts/rollout/v1/rollout.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const heap = (): number => {
  gc();
  gc();
  return process.memoryUsage().heapUsed;
};

const watchRequest = (request: Partial<WatchRequest>): WatchRequest => ({ environments: [], groupIds: [], fullTrajectories: false, stageEvents: true, statsIntervalMs: 100, ...request });

/** How a watch ends up: streaming (its first message came) or refused with a status, its details and rollout-field. */
function outcome(call: ClientReadableStream<WatchResponse>): Promise<{ code: number; details: string; field: string | undefined }> {
  return new Promise((resolve) => {
    call.on('data', () => resolve({ code: -1, details: 'streaming', field: undefined }));
    call.on('error', (e: ServiceError) => resolve({ code: e.code, details: e.details, field: e.metadata?.get('rollout-field')[0] as string | undefined }));
  });
}

describe('Watch requests are bounded before they are turned into filters', () => {
  let server: RolloutServer;
  let client: InstanceType<typeof RolloutServiceClient>;
  const calls: ClientReadableStream<WatchResponse>[] = [];
  beforeAll(async () => {
    server = await startRolloutServer({ port: 0, backends: [], tokenWorkers: { count: 0 } }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() });
    client = new RolloutServiceClient(server.address, credentials.createInsecure());
  });
  afterEach(() => {
    for (const c of calls.splice(0)) c.cancel();
  });
  afterAll(async () => {
    client?.close();
    await server?.shutdown();
  });

  const watch = (request: Partial<WatchRequest>): ClientReadableStream<WatchResponse> => {
    const call = client.watch(watchRequest(request));
    calls.push(call);
    return call;
  };

  it('refuses a 60 MiB group_ids filter by field (INVALID_ARGUMENT), over Watch\u2019s own request bound, without decoding it', async () => {
    const alphabet = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789';
    const groupIds: string[] = [];
    for (let i = 0; groupIds.length * 6 < (60 << 20); i++) {
      let s = '';
      for (let k = 0, n = i; k < 4; k++, n = Math.floor(n / 62)) s += alphabet[n % 62];
      groupIds.push(s);
    }
    const bytes = Buffer.from(WatchRequest.encode(watchRequest({ groupIds })).finish());
    groupIds.length = 0;
    const before = heap();
    const call = client.makeServerStreamRequest('/rollout.v1.RolloutService/Watch', (b: Buffer) => b, (b: Buffer) => WatchResponse.decode(b), bytes) as ClientReadableStream<WatchResponse>;
    calls.push(call);
    const got = await outcome(call);
    expect(got.code).toBe(status.INVALID_ARGUMENT);
    expect(got.field).toBe('group_ids');
    expect(got.details).toMatch(/^group_ids: the request is \d+ bytes, over the 1048576-byte limit of Watch/);
    // Nothing of it is kept: ~11 M decoded strings in a Set were ~670 MiB.
    expect(heap() - before).toBeLessThan(64 << 20);
  }, 120_000);

  it('refuses more than 1024 entries or an entry over 256 bytes, naming the filter', async () => {
    const tooMany = await outcome(watch({ groupIds: Array.from({ length: 1025 }, (_, i) => `g${i}`) }));
    expect(tooMany).toEqual({ code: status.INVALID_ARGUMENT, details: 'group_ids: at most 1024 entries, got 1025', field: 'group_ids' });
    const tooLong = await outcome(watch({ environments: ['math', 'é'.repeat(129)] }));
    expect(tooLong).toEqual({ code: status.INVALID_ARGUMENT, details: 'environments: entry 1 is over 256 bytes', field: 'environments' });
    // The largest filters allowed are served.
    const largest = await outcome(watch({ groupIds: Array.from({ length: 1024 }, (_, i) => `${i}`.padEnd(256, 'x')), environments: Array.from({ length: 1024 }, (_, i) => `e${i}`) }));
    expect(largest.code).toBe(-1);
  });

  it('bounds the requests of the admin services too (64 KiB), naming the largest field', async () => {
    const backends = new BackendServiceClient(server.address, credentials.createInsecure());
    try {
      const request = AddBackendRequest.fromPartial({ url: 'http://127.0.0.1:1', model: 'm'.repeat(100_000) });
      const err = await new Promise<ServiceError | null>((resolve) => backends.addBackend(request, new Metadata(), (e) => resolve(e)));
      expect(err?.code).toBe(status.INVALID_ARGUMENT);
      expect(err?.details).toMatch(/^model: the request is \d+ bytes, over the 65536-byte limit of AddBackend/);
    } finally {
      backends.close();
    }
  });
});

describe('open watches are bounded server-wide (watch.maxOpen)', () => {
  let server: RolloutServer;
  let client: InstanceType<typeof RolloutServiceClient>;
  const calls: ClientReadableStream<WatchResponse>[] = [];
  beforeAll(async () => {
    server = await startRolloutServer({ port: 0, backends: [], tokenWorkers: { count: 0 }, watch: { maxOpen: 3 } }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() });
    client = new RolloutServiceClient(server.address, credentials.createInsecure());
  });
  afterAll(async () => {
    for (const c of calls) c.cancel();
    client?.close();
    await server?.shutdown();
  });
  const watch = (): ClientReadableStream<WatchResponse> => {
    const call = client.watch(watchRequest({}));
    calls.push(call);
    return call;
  };

  it('refuses a watch past the limit with RESOURCE_EXHAUSTED, and lets one in again when another closes', async () => {
    const open = [watch(), watch(), watch()];
    for (const call of open) expect((await outcome(call)).code).toBe(-1);
    const refused = await outcome(watch());
    expect(refused.code).toBe(status.RESOURCE_EXHAUSTED);
    expect(refused.details).toContain('watch.maxOpen 3');
    open[0]!.cancel();
    // The server sees the cancel on its own time: try until a new watch is let in (bounded).
    let next: number = status.RESOURCE_EXHAUSTED;
    for (let i = 0; i < 200 && next === status.RESOURCE_EXHAUSTED; i++) {
      await sleep(50);
      next = (await outcome(watch())).code;
    }
    expect(next).toBe(-1);
  });
});

describe('Watch queues hold what their byte bound counts', () => {
  let server: RolloutServer;
  const calls: ClientReadableStream<WatchResponse>[] = [];
  const clients: InstanceType<typeof RolloutServiceClient>[] = [];
  beforeAll(async () => {
    server = await startRolloutServer({ port: 0, backends: [], tokenWorkers: { count: 0 } }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() });
  });
  afterAll(async () => {
    for (const c of calls) c.cancel();
    for (const c of clients) c.close();
    await server?.shutdown();
  });

  it('ten stalled stage-event watchers grow the heap by less than their 4 MiB bounds, however many events pass', async () => {
    const WATCHERS = 10;
    for (let i = 0; i < WATCHERS; i++) {
      // One channel each (distinct options => distinct connection), never read: a hung dashboard.
      const client = new RolloutServiceClient(server.address, credentials.createInsecure(), { 'grpc.primary_user_agent': `stalled-${i}` });
      clients.push(client);
      const call = client.watch(watchRequest({ statsIntervalMs: 0 }));
      call.pause();
      call.on('error', () => undefined);
      calls.push(call);
    }
    // Subscribed once an event reaches them: wait until the server counts the watches as open.
    await sleep(1_000);
    const before = heap();
    const events$ = server.runtime.pipeline.events$;
    const stages = ['queued', 'init', 'run', 'eval', 'done'] as const;
    for (let t = 0; t < 60_000; t++) {
      const sample = { index: 0, task: { taskId: `run-42-task-${t}`, groupId: `group-${t >> 3}`, environment: { name: 'math' } } } as unknown as Sample;
      for (const stage of stages) events$.next({ type: 'stage', sample, stage });
      if (t % 2_000 === 0) await sleep(1);
    }
    await sleep(500);
    const grown = heap() - before;
    // Held as objects, the queues were ~4.5x their bound (190 MiB here); encoded and packed, they are their bytes,
    // which live outside the V8 heap.
    expect(grown).toBeLessThan(WATCHERS * (4 << 20));
  }, 120_000);
});
