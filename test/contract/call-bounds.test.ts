import { credentials, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { connect, type ClientHttp2Session, type ClientHttp2Stream } from 'node:http2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startRolloutServer, type RolloutServer } from '../../src/app.js';
import { silentLogger } from '../../src/observability/logger.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { GetTrajectoryRequest, RolloutRequest, RolloutServiceClient, type GetTrajectoryResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { eventually, within } from '../support/wait.js';

const FIRST_MESSAGE_MS = 300;
const UNARY_DEADLINE_MS = 600;

/** The status a raw HTTP/2 gRPC call ends with (from its trailers, or its trailers-only headers). */
function statusOf(stream: ClientHttp2Stream): Promise<{ code: number; message: string }> {
  return new Promise((resolve) => {
    const read = (h: Record<string, unknown>): void => {
      if (h['grpc-status'] !== undefined) resolve({ code: Number(h['grpc-status']), message: decodeURIComponent(String(h['grpc-message'] ?? '')) });
    };
    stream.on('response', read);
    stream.on('trailers', read);
    stream.on('close', () => resolve({ code: -1, message: `closed, rst ${stream.rstCode}` }));
  });
}

describe('calls that hold the server without sending, or too many at once on one connection', () => {
  let server: RolloutServer;
  const connections: ClientHttp2Session[] = [];
  const clients: InstanceType<typeof RolloutServiceClient>[] = [];
  beforeAll(async () => {
    server = await startRolloutServer(
      {
        port: 0,
        backends: [],
        tokenWorkers: { count: 0 },
        backendAcquireTimeoutMs: 120_000,
        calls: { firstMessageTimeoutMs: FIRST_MESSAGE_MS, unaryDeadlineMs: UNARY_DEADLINE_MS },
        connections: { maxConcurrentStreams: 8, maxUnaryInFlight: 2 },
      },
      { logger: silentLogger(), sandboxes: new NullSandboxDriver() },
    );
  });
  afterAll(async () => {
    for (const c of connections) c.destroy();
    for (const c of clients) c.close();
    await server?.shutdown();
  });

  const rawConnection = (): ClientHttp2Session => {
    const connection = connect(`http://${server.address}`);
    connection.on('error', () => undefined);
    connections.push(connection);
    return connection;
  };
  /** A grpc-js client on a connection of its own (grpc-js shares connections between clients of one target otherwise). */
  const ownClient = (): InstanceType<typeof RolloutServiceClient> => {
    const client = new RolloutServiceClient(server.address, credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 });
    clients.push(client);
    return client;
  };

  it('a call that sends its headers and nothing else is ended DEADLINE_EXCEEDED after calls.firstMessageTimeoutMs, stream or unary, and frees its slot', async () => {
    const subscribers = (): number => (server.runtime.pipeline.events$ as unknown as { observers: unknown[] }).observers.length;
    const before = subscribers();
    const connection = rawConnection();
    const paths = ['Rollout', 'Rollout', 'Rollout', 'Rollout', 'Rollout', 'Watch', 'Submit', 'GetTrajectory'];
    // As many calls as the connection may hold (maxConcurrentStreams 8): headers only, never a message or an end.
    const calls = paths.map((method) => {
      const stream = connection.request({ ':method': 'POST', ':path': `/rollout.v1.RolloutService/${method}`, 'content-type': 'application/grpc', te: 'trailers' }, { endStream: false });
      stream.on('error', () => undefined);
      // Answered, the client lets its side go (a stream counts against its connection's bound until both sides end).
      return statusOf(stream).finally(() => stream.close());
    });
    await eventually(() => subscribers() === before + 5, 'the Rollout handlers to start');
    for (const ended of await within(Promise.all(calls), 10_000, 'the idle calls to be ended')) {
      expect(ended.code).toBe(status.DEADLINE_EXCEEDED);
      expect(ended.message).toContain('calls.firstMessageTimeoutMs');
    }
    // What their handlers held is released, and the connection's slots serve new calls.
    await eventually(() => subscribers() === before, 'the Rollout handlers to end');
    const open = RolloutRequest.encode({ kind: { $case: 'open', value: { sessionId: '', resume: false, stageEvents: false } } }).finish();
    const more = Array.from({ length: 8 }, () => {
      const stream = connection.request({ ':method': 'POST', ':path': '/rollout.v1.RolloutService/Rollout', 'content-type': 'application/grpc', te: 'trailers' });
      stream.on('error', () => undefined);
      const framed = Buffer.alloc(5 + open.length);
      framed.writeUInt32BE(open.length, 1);
      framed.set(open, 5);
      stream.write(framed);
      return { stream, answered: new Promise<void>((resolve) => stream.once('data', () => resolve())) };
    });
    await within(Promise.all(more.map((m) => m.answered)), 10_000, 'streams on the freed slots to be answered');
    for (const m of more) m.stream.close();
  }, 30_000);

  it('a call whose first message comes in time is not cut, however long it then lasts', async () => {
    const client = ownClient();
    const call = client.rollout();
    const opened = new Promise<void>((resolve) => call.once('data', () => resolve()));
    call.on('error', () => undefined);
    call.write({ kind: { $case: 'open', value: { sessionId: 'quiet-but-legit', resume: false, stageEvents: false } } });
    await within(opened, 10_000, 'the session to open');
    const ended = new Promise<{ code: number }>((resolve) => call.on('status', resolve));
    // Three times the first-message bound with nothing sent: still open.
    const start = Date.now();
    await eventually(() => Date.now() - start > 3 * FIRST_MESSAGE_MS, 'time to pass', 10_000);
    expect(server.sessions.get('quiet-but-legit')?.isAttached).toBe(true);
    call.end();
    expect((await within(ended, 10_000, 'the stream to end')).code).toBe(status.OK);
  }, 30_000);

  it('a unary call without a deadline ends at calls.unaryDeadlineMs; one with its own deadline keeps it', async () => {
    const client = ownClient();
    const submitted = await new Promise<{ taskId: string }>((resolve, reject) =>
      client.submit({ task: { taskId: 'never-served', environment: 'math', numSamples: 1, instance: { problem: '1+1', answer: '2' }, metadata: {} } as never }, (err, r) => (err ? reject(err) : resolve(r))),
    );
    const getTrajectory = (deadlineMs?: number): Promise<GetTrajectoryResponse | ServiceError> =>
      new Promise((resolve) =>
        client.getTrajectory(GetTrajectoryRequest.fromPartial({ taskId: submitted.taskId, wait: true }), new Metadata(), deadlineMs === undefined ? {} : { deadline: Date.now() + deadlineMs }, (err, r) => resolve(err ?? r!)),
      );
    const start = Date.now();
    const unbounded = (await within(getTrajectory(), 10_000, 'a wait without a deadline')) as ServiceError;
    expect(unbounded.code).toBe(status.DEADLINE_EXCEEDED);
    expect(unbounded.details).toContain('calls.unaryDeadlineMs');
    expect(Date.now() - start).toBeGreaterThanOrEqual(UNARY_DEADLINE_MS - 50);
    // Its own deadline, longer than the server's default: answered at it with what finished (nothing yet).
    const own = (await within(getTrajectory(3 * UNARY_DEADLINE_MS), 10_000, 'a wait with a deadline')) as GetTrajectoryResponse;
    expect(own.pending).toBe(1);
  }, 30_000);

  it('a grpc-timeout past what grpc-js reads as int32 ms (~24.8 days; a Python client waiting 30 days) is a long deadline, not an expired one', async () => {
    const connection = rawConnection();
    for (const timeout of ['720H', '2592000S', '99999999H', '2147483648m']) {
      // A stream that opens a session and half-closes: it ends OK once answered, unless its deadline ended it first.
      const stream = connection.request({ ':method': 'POST', ':path': '/rollout.v1.RolloutService/Rollout', 'content-type': 'application/grpc', te: 'trailers', 'grpc-timeout': timeout });
      stream.on('error', () => undefined);
      const open = RolloutRequest.encode({ kind: { $case: 'open', value: { sessionId: '', resume: false, stageEvents: false } } }).finish();
      const framed = Buffer.alloc(5 + open.length);
      framed.writeUInt32BE(open.length, 1);
      framed.set(open, 5);
      const ended = statusOf(stream);
      stream.write(framed);
      // Still open well after it started (an expired deadline ends it within a millisecond), then half-closed.
      const start = Date.now();
      await eventually(() => Date.now() - start > 200, 'time to pass');
      stream.end();
      expect({ timeout, code: (await within(ended, 10_000, `a call with grpc-timeout ${timeout}`)).code }).toEqual({ timeout, code: status.OK });
    }
  });

  it('unary calls past connections.maxUnaryInFlight on one connection are RESOURCE_EXHAUSTED naming it; another connection is served', async () => {
    const crowded = ownClient();
    const waits = [0, 1].map(
      () =>
        new Promise<ServiceError | null>((resolve) =>
          crowded.getTrajectory(GetTrajectoryRequest.fromPartial({ taskId: 'never-served', wait: true }), new Metadata(), { deadline: Date.now() + 5_000 }, (err) => resolve(err)),
        ),
    );
    // The two are waiting once their connection counts them; a third is refused at once.
    let third: ServiceError | null = null;
    await eventually(async () => {
      third = await new Promise<ServiceError | null>((resolve) => crowded.listEnvironments({}, (err) => resolve(err)));
      return third !== null;
    }, 'the connection to be full');
    expect(third!.code).toBe(status.RESOURCE_EXHAUSTED);
    expect(third!.details).toContain('connections.maxUnaryInFlight');
    const other = ownClient();
    const envs = await new Promise<number>((resolve, reject) => other.listEnvironments({}, (err, r) => (err ? reject(err) : resolve(r.environments.length))));
    expect(envs).toBeGreaterThan(0);
    for (const w of await Promise.all(waits)) expect(w).toBeNull();
    // Once they ended, the connection is served again.
    await new Promise<void>((resolve, reject) => crowded.listEnvironments({}, (err) => (err ? reject(err) : resolve())));
  }, 30_000);
});

describe('connections.maxUnaryInFlight counts a call out however it ends', () => {
  const TOKEN = 'call-bounds-token';
  let server: RolloutServer;
  const clients: InstanceType<typeof RolloutServiceClient>[] = [];
  beforeAll(async () => {
    server = await startRolloutServer(
      {
        port: 0,
        backends: [],
        tokenWorkers: { count: 0 },
        backendAcquireTimeoutMs: 120_000,
        auth: { token: TOKEN },
        calls: { unaryDeadlineMs: UNARY_DEADLINE_MS },
        connections: { maxUnaryInFlight: 2 },
      },
      { logger: silentLogger(), sandboxes: new NullSandboxDriver() },
    );
  });
  afterAll(async () => {
    for (const c of clients) c.close();
    await server?.shutdown();
  });

  const authorized = (): Metadata => {
    const m = new Metadata();
    m.set('authorization', `Bearer ${TOKEN}`);
    return m;
  };

  it('after calls cancelled (new ones sent right behind the cancels), ended by calls.unaryDeadlineMs, failed in the handler, refused by auth or at the cap, the connection still takes its full count', async () => {
    // One connection for everything: the count is per connection.
    const client = new RolloutServiceClient(server.address, credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 });
    clients.push(client);
    const call = (metadata: Metadata, request: Partial<GetTrajectoryRequest>, deadlineMs?: number): { ended: Promise<ServiceError | null>; cancel: () => void } => {
      let cancel = (): void => undefined;
      const ended = new Promise<ServiceError | null>((resolve) => {
        const c = client.getTrajectory(GetTrajectoryRequest.fromPartial(request), metadata, deadlineMs === undefined ? {} : { deadline: Date.now() + deadlineMs }, (err) => resolve(err));
        cancel = () => c.cancel();
      });
      return { ended, cancel };
    };
    // A task no engine serves (there is none): a wait on it lasts until its call ends.
    const { taskId } = await new Promise<{ taskId: string }>((resolve, reject) =>
      client.submit({ task: { taskId: 'never-served', environment: 'math', numSamples: 1, instance: { problem: '1+1', answer: '2' }, metadata: {} } as never }, authorized(), (err, r) => (err ? reject(err) : resolve(r))),
    );
    const refusedAtCap = async (): Promise<void> =>
      eventually(async () => {
        const third = await call(authorized(), { taskId: 'probe' }).ended;
        return third?.code === status.RESOURCE_EXHAUSTED;
      }, 'a third call to be refused at connections.maxUnaryInFlight');
    /** Two calls waiting on a task that never comes: both must be taken (a leaked count would refuse one at once). */
    const fill = async (deadlineMs?: number): Promise<Array<{ ended: Promise<ServiceError | null>; cancel: () => void }>> => {
      const waits = [0, 1].map(() => call(authorized(), { taskId, wait: true }, deadlineMs));
      await refusedAtCap();
      return waits;
    };
    for (let round = 0; round < 3; round++) {
      // Cancelled by the client while counted.
      const cancelled = await fill(20_000);
      for (const w of cancelled) w.cancel();
      expect((await Promise.all(cancelled.map((w) => w.ended))).map((e) => e?.code)).toEqual([status.CANCELLED, status.CANCELLED]);
      // Sent without a deadline: ended by calls.unaryDeadlineMs (the interceptor's own status).
      const unbounded = await fill();
      expect((await Promise.all(unbounded.map((w) => w.ended))).map((e) => e?.code)).toEqual([status.DEADLINE_EXCEEDED, status.DEADLINE_EXCEEDED]);
      // Refused by auth after the bounds counted them, and failed in the handler (no such task).
      const refused = await Promise.all([call(new Metadata(), { taskId: 'x' }).ended, call(new Metadata(), { taskId: 'x' }).ended]);
      expect(refused.map((e) => e?.code)).toEqual([status.UNAUTHENTICATED, status.UNAUTHENTICATED]);
      const failed = await Promise.all([call(authorized(), { taskId: 'unknown' }).ended, call(authorized(), { taskId: 'unknown' }).ended]);
      expect(failed.map((e) => e?.code)).toEqual([status.NOT_FOUND, status.NOT_FOUND]);
    }
    // Still two in flight at once, neither refused.
    const last = await fill(20_000);
    for (const w of last) w.cancel();
    expect((await Promise.all(last.map((w) => w.ended))).map((e) => e?.code)).toEqual([status.CANCELLED, status.CANCELLED]);
  }, 60_000);
});
