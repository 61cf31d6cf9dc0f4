import { credentials, status, type ClientReadableStream, type ServiceError } from '@grpc/grpc-js';
import { connect, type ClientHttp2Session } from 'node:http2';
import { connect as connectTcp } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startRolloutServer, type RolloutServer } from '../../src/app.js';
import { silentLogger } from '../../src/observability/logger.js';
import type { Sample } from '../../src/pipeline/sample.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { RolloutRequest, RolloutServiceClient, WatchRequest, type WatchResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { rawRollout, type RawRollout } from '../support/raw-rollout.js';
import { eventually } from '../support/wait.js';

/** A gRPC message frame (uncompressed) around `bytes`. */
const frame = (bytes: Uint8Array): Buffer => {
  const out = Buffer.alloc(5 + bytes.length);
  out.writeUInt32BE(bytes.length, 1);
  out.set(bytes, 5);
  return out;
};

/** How a Watch ends up: streaming (a first message came) or refused with a status. */
function outcome(call: ClientReadableStream<WatchResponse>): Promise<{ code: number; details: string }> {
  return new Promise((resolve) => {
    call.on('data', () => resolve({ code: -1, details: 'streaming' }));
    call.on('error', (e: ServiceError) => resolve({ code: e.code, details: e.details }));
  });
}

describe('one misbehaving client cannot hold what other clients need', () => {
  let server: RolloutServer;
  const connections: ClientHttp2Session[] = [];
  const clients: InstanceType<typeof RolloutServiceClient>[] = [];
  beforeAll(async () => {
    server = await startRolloutServer(
      { port: 0, backends: [], tokenWorkers: { count: 0 }, watch: { maxOpen: 1, stalledMs: 500 }, connections: { maxConcurrentStreams: 32 } },
      { logger: silentLogger(), sandboxes: new NullSandboxDriver() },
    );
  });
  afterAll(async () => {
    for (const c of connections) c.destroy();
    for (const c of clients) c.close();
    await server?.shutdown();
  });

  const rawConnection = (settings: { initialWindowSize?: number } = {}): ClientHttp2Session => {
    const connection = connect(`http://${server.address}`, { settings });
    connection.on('error', () => undefined);
    connections.push(connection);
    return connection;
  };

  it('a connection is told the bound on its concurrent calls (connections.maxConcurrentStreams): it cannot open calls without limit', async () => {
    const connection = rawConnection();
    const settings = await new Promise<{ maxConcurrentStreams?: number }>((resolve) => connection.once('remoteSettings', resolve));
    expect(settings.maxConcurrentStreams).toBe(32);
  });

  it('calls past the bound wait on the client (not failed) and open as earlier ones end', async () => {
    // One grpc-js channel: 40 Rollout streams, each opening a session, on one connection bounded to 32 calls.
    const client = new RolloutServiceClient(server.address, credentials.createInsecure());
    clients.push(client);
    const calls = Array.from({ length: 40 }, (_, i) => {
      const call = client.rollout();
      const opened = new Promise<void>((resolve) => call.on('data', () => resolve()));
      call.on('error', () => undefined);
      call.write({ kind: { $case: 'open', value: { sessionId: `bounded-${i}`, resume: false, stageEvents: false } } });
      return { call, opened, isOpen: false };
    });
    for (const c of calls) void c.opened.then(() => (c.isOpen = true));
    await eventually(() => calls.filter((c) => c.isOpen).length === 32, '32 streams to open');
    // Held at 32: the others wait for a stream of the connection (no failure, no session).
    expect(server.sessions.size).toBe(32);
    for (const c of calls.filter((x) => x.isOpen).slice(0, 8)) c.call.end();
    await Promise.all(calls.map((c) => c.opened));
    for (const c of calls) c.call.end();
  });

  it('a client that floods PING frames and never reads the acks has its connection closed; other clients are served', async () => {
    // Raw bytes: Node's own HTTP/2 client keeps at most 10 pings outstanding.
    const socket = connectTcp({ host: '127.0.0.1', port: server.port });
    const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
    socket.on('error', () => undefined);
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
    socket.pause();
    const ping = Buffer.from([0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    const settings = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]);
    socket.write(Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'), settings]));
    const batch = Buffer.concat(Array.from({ length: 10_000 }, () => ping));
    for (let i = 0; i < 100 && !socket.destroyed; i++) socket.write(batch);
    // Once the server has given up on it, whatever it sent is read and the socket ends.
    socket.resume();
    socket.on('data', () => undefined);
    await closed;
    const other = new RolloutServiceClient(server.address, credentials.createInsecure());
    clients.push(other);
    const envs = await new Promise<number>((resolve, reject) => other.listEnvironments({}, (err, r) => (err ? reject(err) : resolve(r.environments.length))));
    expect(envs).toBeGreaterThan(0);
  }, 60_000);

  it('a Watch whose client stopped reading is ended RESOURCE_EXHAUSTED after watch.stalledMs, so its watch.maxOpen slot serves another dashboard', async () => {
    // A raw HTTP/2 client with a 1 KiB window: grpc-js's own takes every message off the wire whether its caller reads or not.
    const connection = rawConnection({ initialWindowSize: 1024 });
    const stream = connection.request({ ':method': 'POST', ':path': '/rollout.v1.RolloutService/Watch', 'content-type': 'application/grpc', te: 'trailers' });
    const trailers = new Promise<Record<string, unknown>>((resolve) => stream.on('trailers', (t) => resolve(t)));
    stream.on('error', () => undefined);
    stream.end(frame(WatchRequest.encode({ environments: [], groupIds: [], fullTrajectories: false, stageEvents: true, statsIntervalMs: 0 }).finish()));
    const events$ = server.runtime.pipeline.events$;
    const event = (t: number): void => {
      const sample = { index: 0, task: { taskId: `stalled-watch-task-${t}`, groupId: 'g', environment: { name: 'math' } } } as unknown as Sample;
      events$.next({ type: 'stage', sample, stage: 'run' });
    };
    // Subscribed once its first event arrives; from then on the client reads nothing.
    const first = new Promise<void>((resolve) => stream.once('data', () => resolve()));
    let t = 0;
    await eventually(async () => {
      event(t++);
      return Promise.race([first.then(() => true), new Promise<boolean>((resolve) => setImmediate(() => resolve(false)))]);
    }, 'the watch to stream');
    stream.pause();
    // Far more than the window and the transport's buffers hold: its writes block.
    for (let i = 0; i < 20_000; i++) event(t++);

    const other = new RolloutServiceClient(server.address, credentials.createInsecure());
    clients.push(other);
    let next = { code: status.RESOURCE_EXHAUSTED as number, details: '' };
    await eventually(async () => {
      const call = other.watch(WatchRequest.fromPartial({ statsIntervalMs: 100 }));
      next = await outcome(call);
      call.cancel();
      return next.code !== status.RESOURCE_EXHAUSTED;
    }, 'the stalled watch to give its slot up', 20_000);
    expect(next.code).toBe(-1);
    // The stalled client, when it reads again, learns why its watch ended.
    stream.resume();
    const t2 = await trailers;
    expect(String(t2['grpc-status'])).toBe(String(status.RESOURCE_EXHAUSTED));
    expect(decodeURIComponent(String(t2['grpc-message']))).toContain('watch.stalledMs');
  }, 60_000);
});

describe('sessions opened with fresh ids and abandoned holding nothing do not accumulate', () => {
  let server: RolloutServer;
  const streams: RawRollout[] = [];
  beforeAll(async () => {
    server = await startRolloutServer({ port: 0, backends: [], tokenWorkers: { count: 0 } }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() });
  });
  afterAll(async () => {
    for (const s of streams) s.client.close();
    await server?.shutdown();
  });

  /** Opens a session on a stream of its own and waits for `opened`. */
  const openSession = async (sessionId: string): Promise<RawRollout> => {
    const stream = rawRollout(server.address);
    streams.push(stream);
    stream.send(RolloutRequest.encode({ kind: { $case: 'open', value: { sessionId, resume: false, stageEvents: false } } }).finish());
    await eventually(() => stream.received.some((r) => r.kind?.$case === 'opened'), `session ${sessionId} to open`);
    return stream;
  };

  it('a client that opens 200 sessions and cancels each leaves none behind (nothing to resume), and a live session stays', async () => {
    const live = await openSession('live-trainer');
    for (let i = 0; i < 200; i++) {
      const s = await openSession(`abandoned-${i}`);
      s.cancel();
      await eventually(() => server.sessions.get(`abandoned-${i}`) === undefined, 'the abandoned session to be dropped');
    }
    expect(server.sessions.size).toBe(1);
    expect(server.sessions.get('live-trainer')?.detachedAt).toBeUndefined();
    live.end();
    expect(await live.status).toBe(status.OK);
  }, 60_000);
});
