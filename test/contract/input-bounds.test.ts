import { Client, credentials, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import fc from 'fast-check';
import { connect } from 'node:http2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskRejectedError } from '../../src/client/rollout-client.js';
import { startRolloutServer, type RolloutServer } from '../../src/app.js';
import { RolloutError } from '../../src/errors.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { silentLogger } from '../../src/observability/logger.js';
import { toServiceError } from '../../src/contract/status.js';
import { tolerantService, undecodable } from '../../src/contract/tolerant-decode.js';
import { taskWireBounds } from '../../src/pipeline/validate-task.js';
import {
  CancelRequest,
  GetTrajectoryRequest,
  RolloutRequest,
  RolloutResponse,
  RolloutServiceService,
  SubmitRequest,
  TaskSpec,
  TrajectoryStatus,
} from '../../gen/ts/rollout/v1/rollout.js';
import { collect, mathTask, startHarness, type Harness } from '../support/harness.js';
import { rawRollout } from '../support/raw-rollout.js';
import { eventually } from '../support/wait.js';

const MAX_INSTANCE_BYTES = 16 * 1024;

/** Any unary method with raw bytes, a deadline so a call left without a status fails the test instead of hanging it. */
function rawUnary(client: Client, path: string, bytes: Uint8Array): Promise<{ code: number; field: string; details: string }> {
  return new Promise((resolve) => {
    client.makeUnaryRequest(
      path,
      (b: Uint8Array) => Buffer.from(b),
      (b: Buffer) => b,
      bytes,
      new Metadata(),
      { deadline: Date.now() + 10_000 },
      (err: ServiceError | null) => resolve(err ? { code: err.code, field: String(err.metadata.get('rollout-field')[0] ?? ''), details: err.details } : { code: status.OK, field: '', details: '' }),
    );
  });
}

/** A Struct of `n` bytes of numbers on the wire: many times larger there than as JSON (`[0,0,...]`). */
const zeros = (wireBytes: number): Record<string, unknown> => ({ problem: '1+1', answer: '2', pad: Array.from({ length: Math.ceil(wireBytes / 11) }, () => 0) });

describe('a task is bounded by field before its bytes are decoded', () => {
  /** The generated deserializers of RolloutService, wrapped in a TEST DOUBLE that counts the decodes. */
  function countingService(): { service: typeof RolloutServiceService; decodes: () => number } {
    let decodes = 0;
    const wrapped = Object.fromEntries(
      Object.entries(RolloutServiceService).map(([name, method]) => [name, { ...method, requestDeserialize: (b: Buffer) => (decodes++, method.requestDeserialize(b)) }]),
    ) as unknown as typeof RolloutServiceService;
    return { service: tolerantService(wrapped, 64 << 20, {}, taskWireBounds(MAX_INSTANCE_BYTES)), decodes: () => decodes };
  }
  const instance = { problem: 'p'.repeat(64 * MAX_INSTANCE_BYTES), answer: '1' };

  it('refuses a Submit whose instance is over the bound naming task.instance, without decoding the request', () => {
    const { service, decodes } = countingService();
    const bytes = Buffer.from(SubmitRequest.encode({ task: TaskSpec.fromPartial({ taskId: 'huge', numSamples: 1, environment: 'math', instance }) }).finish());
    const bad = undecodable(service.submit.requestDeserialize(bytes));
    expect(bad).toMatchObject({ field: 'task.instance', taskId: 'huge' });
    expect(bad?.reason).toMatch(/^too large: \d+ bytes on the wire/);
    expect(decodes()).toBe(0);
  });

  it('refuses the same task on the Rollout stream, and every field a task bounds (ids, sampling, metadata), undecoded', () => {
    const { service, decodes } = countingService();
    const encode = (spec: Partial<TaskSpec>): Buffer => Buffer.from(RolloutRequest.encode({ kind: { $case: 'task', value: TaskSpec.fromPartial({ taskId: 't', numSamples: 1, environment: 'math', ...spec }) } }).finish());
    const cases: [Partial<TaskSpec>, string][] = [
      [{ instance }, 'task.instance'],
      [{ taskId: 'x'.repeat(1 << 20) }, 'task.task_id'],
      [{ groupId: 'x'.repeat(1 << 20) }, 'task.group_id'],
      [{ environment: 'x'.repeat(1 << 20) }, 'task.environment'],
      [{ sampling: { stop: Array.from({ length: 100_000 }, () => 'x'), maxTokensPerTurn: 0, maxTotalTokens: 0 } }, 'task.sampling'],
      [{ metadata: Object.fromEntries(Array.from({ length: 100_000 }, (_, i) => [`k${i}`, 'v'])) }, 'task.metadata'],
    ];
    for (const [spec, field] of cases) expect(undecodable(service.rollout.requestDeserialize(encode(spec)))?.field, field).toBe(field);
    expect(decodes()).toBe(0);
    // What validation allows still decodes: an instance at its JSON limit made of numbers (many times larger on the wire).
    const valid = zeros(5 * MAX_INSTANCE_BYTES);
    expect(JSON.stringify(valid).length).toBeLessThanOrEqual(MAX_INSTANCE_BYTES);
    const small = encode({ instance: valid });
    expect(small.length).toBeGreaterThan(5 * MAX_INSTANCE_BYTES);
    expect(undecodable(service.rollout.requestDeserialize(small))).toBeUndefined();
    expect(decodes()).toBe(1);
  });
});

describe('the instance bound on the wire never refuses an instance validation allows', () => {
  it('property: any JSON object takes at most the bound for its own JSON size on the wire (the tightest limit it passes)', () => {
    fc.assert(
      fc.property(fc.dictionary(fc.string(), fc.jsonValue({ maxDepth: 6 })), (instance) => {
        const json = Buffer.byteLength(JSON.stringify(instance));
        const wire = TaskSpec.encode(TaskSpec.fromPartial({ instance })).finish().length;
        expect(wire).toBeLessThanOrEqual(taskWireBounds(json).instance!.bytes);
      }),
      { numRuns: 2000 },
    );
    // The worst case by construction: a long list of single-digit numbers.
    const digits = { a: Array.from({ length: 100_000 }, (_, i) => i % 10) };
    expect(TaskSpec.encode(TaskSpec.fromPartial({ instance: digits })).finish().length).toBeLessThanOrEqual(taskWireBounds(JSON.stringify(digits).length).instance!.bytes);
  });
});

describe('error answers a client can always receive', () => {
  it('a status names its field in an ASCII trailer and keeps its message within what HTTP/2 trailers carry', () => {
    const err = toServiceError(RolloutError.invalid('task.metadata.é\n', 'é'.repeat(100_000)), silentLogger());
    expect(err.code).toBe(status.INVALID_ARGUMENT);
    expect(err.metadata?.get('rollout-field')).toEqual(['task.metadata.\\u00e9\\u000a']);
    // grpc-js percent-encodes the message into the grpc-message trailer: bounded there, not in characters.
    expect(encodeURI(err.details!).length).toBeLessThanOrEqual(4096);
    expect(err.details).toMatch(/^task\.metadata\.é\n: é+…$/);
    // Never a lone surrogate (grpc-js's encodeURI would throw on it).
    const cut = toServiceError(new RolloutError('not_found', `x${'😀'.repeat(5000)}`), silentLogger()).details!;
    expect(() => encodeURI(cut)).not.toThrow();
  });
});

describe('unary calls and streams answer hostile sizes by field, against a real server', () => {
  let h: Harness;
  let raw: Client;
  beforeAll(async () => {
    h = await startHarness({ maxInstanceBytes: MAX_INSTANCE_BYTES, maxMessageBytes: 4 << 20 });
    raw = new Client(h.server.address, credentials.createInsecure());
  });
  afterAll(async () => {
    raw?.close();
    await h?.close();
  });

  it('a field named by a non-ASCII map key is answered INVALID_ARGUMENT (no header can carry the raw key), and the server serves on', async () => {
    const bytes = Buffer.from(SubmitRequest.encode({ task: TaskSpec.fromPartial({ ...mathTask('key-e', 1, 1), metadata: { é: 'MARK' } }) }).finish());
    bytes[bytes.indexOf('MARK') + 3] = 0xff; // the value is no longer UTF-8
    const got = await rawUnary(raw, '/rollout.v1.RolloutService/Submit', bytes);
    expect(got).toMatchObject({ code: status.INVALID_ARGUMENT, field: 'task.metadata.\\u00e9' });
    expect(got.details).toMatch(/^task\.metadata\.é: not valid UTF-8/);
    expect((await h.client.listEnvironments()).environments.map((e) => e.name)).toContain('math');
  });

  it('ids over 256 characters are refused by field on GetTrajectory and Cancel, not echoed into a status no client takes', async () => {
    const id = 'é'.repeat(20_000);
    const get = await rawUnary(raw, '/rollout.v1.RolloutService/GetTrajectory', GetTrajectoryRequest.encode({ taskId: id, wait: false }).finish());
    expect(get).toEqual({ code: status.INVALID_ARGUMENT, field: 'task_id', details: 'task_id: longer than 256 characters' });
    const cancel = await rawUnary(raw, '/rollout.v1.RolloutService/Cancel', CancelRequest.encode({ taskId: id }).finish());
    expect(cancel).toEqual({ code: status.INVALID_ARGUMENT, field: 'task_id', details: 'task_id: longer than 256 characters' });
    const env = await rawUnary(raw, '/rollout.v1.RolloutService/Submit', SubmitRequest.encode({ task: TaskSpec.fromPartial({ ...mathTask('long-env', 1, 1), environment: 'é'.repeat(20_000) }) }).finish());
    expect(env).toEqual({ code: status.INVALID_ARGUMENT, field: 'task.environment', details: 'task.environment: longer than 256 characters' });
  });

  it('an open with a session id over 256 characters ends that stream with INVALID_ARGUMENT naming it, instead of leaving it without a status', async () => {
    const call = raw.makeBidiStreamRequest('/rollout.v1.RolloutService/Rollout', (b: Uint8Array) => Buffer.from(b), (b: Buffer) => RolloutResponse.decode(b), new Metadata(), { deadline: Date.now() + 10_000 });
    const ended = new Promise<{ code: number; details: string; field: unknown }>((resolve) => call.on('status', (s) => resolve({ code: s.code, details: s.details, field: s.metadata.get('rollout-field')[0] })));
    call.on('error', () => undefined);
    call.write(RolloutRequest.encode({ kind: { $case: 'open', value: { sessionId: 'é'.repeat(20_000), resume: true, stageEvents: false } } }).finish());
    expect(await ended).toEqual({ code: status.INVALID_ARGUMENT, details: 'open.session_id: longer than 256 characters', field: 'open.session_id' });
  });

  it('Submit refuses an instance far over the bound as INVALID_ARGUMENT naming task.instance', async () => {
    const got = await rawUnary(raw, '/rollout.v1.RolloutService/Submit', SubmitRequest.encode({ task: TaskSpec.fromPartial(mathTask('far-over', 1, 1, { instance: { problem: 'p'.repeat(2 << 20), answer: '1' } })) }).finish());
    expect(got.code).toBe(status.INVALID_ARGUMENT);
    expect(got.field).toBe('task.instance');
    expect(got.details).toMatch(/^task\.instance: too large: \d+ bytes on the wire/);
  });

  it('on a stream, a task far over the bound is rejected naming instance while the tasks around it complete', async () => {
    const session = h.client.openSession();
    const before = session.submit(mathTask('bounds-before', 1, 3));
    const err = await session.submit(mathTask('bounds-huge', 1, 4, { instance: { problem: 'p'.repeat(2 << 20), answer: '1' } })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TaskRejectedError);
    expect(err).toMatchObject({ taskId: 'bounds-huge', field: 'instance' });
    expect((err as TaskRejectedError).reason).toMatch(/^instance: too large: \d+ bytes on the wire/);
    const after = session.submit(mathTask('bounds-after', 1, 5));
    await Promise.all([before, after]);
    session.close();
    const done = (await collect(session.trajectories())).map((t) => `${t.taskId}#${TrajectoryStatus[t.status]}`).sort();
    expect(done).toEqual(['bounds-after#TRAJECTORY_STATUS_COMPLETED', 'bounds-before#TRAJECTORY_STATUS_COMPLETED']);
  });
});

describe('a rejection never outgrows the message limit of the stream it is sent on', () => {
  let h: Harness;
  beforeAll(async () => {
    // An instance limit as large as the message limit: a Struct key may take most of a request.
    h = await startHarness({ maxInstanceBytes: 1 << 20, maxMessageBytes: 1 << 20 });
  });
  afterAll(async () => h?.close());

  it('a 700 KB key holding a value that is not UTF-8 is rejected naming a bounded path, and the stream serves the next task', async () => {
    const spec = TaskSpec.fromPartial(mathTask('clip-key', 1, 12, { instance: { problem: '1+1', answer: '2', ['k'.repeat(700_000)]: 'MARK' } }));
    const bytes = Buffer.from(RolloutRequest.encode({ kind: { $case: 'task', value: spec } }).finish());
    bytes[bytes.indexOf('MARK') + 3] = 0xff; // the value is no longer UTF-8
    const stream = rawRollout(h.server.address);
    try {
      stream.send(RolloutRequest.encode({ kind: { $case: 'task', value: TaskSpec.fromPartial(mathTask('clip-before', 1, 11)) } }).finish());
      stream.send(bytes);
      stream.send(RolloutRequest.encode({ kind: { $case: 'task', value: TaskSpec.fromPartial(mathTask('clip-after', 1, 13)) } }).finish());
      stream.end();
      expect(await stream.status).toBe(status.OK);
      const responses = await stream.responses;
      const rejected = responses.flatMap((r) => (r.kind?.$case === 'rejected' ? [r.kind.value] : []));
      expect(rejected).toHaveLength(1);
      expect(rejected[0]!.field).toMatch(/^instance\.k{200,}\.\.\.$/);
      expect(rejected[0]!.field.length + rejected[0]!.reason.length).toBeLessThan(8192);
      const done = responses.flatMap((r) => (r.kind?.$case === 'trajectory' ? [`${r.kind.value.taskId}#${TrajectoryStatus[r.kind.value.status]}`] : [])).sort();
      expect(done).toEqual(['clip-after#TRAJECTORY_STATUS_COMPLETED', 'clip-before#TRAJECTORY_STATUS_COMPLETED']);
    } finally {
      stream.client.close();
    }
  });
  it('a task over the message limit whose id alone is 2 MiB is rejected without echoing that id, and the stream goes on', async () => {
    const stream = rawRollout(h.server.address);
    try {
      stream.send(RolloutRequest.encode({ kind: { $case: 'task', value: TaskSpec.fromPartial(mathTask('x'.repeat(2 << 20), 1, 14)) } }).finish());
      stream.send(RolloutRequest.encode({ kind: { $case: 'task', value: TaskSpec.fromPartial(mathTask('id-after', 1, 15)) } }).finish());
      stream.end();
      expect(await stream.status).toBe(status.OK);
      const responses = await stream.responses;
      const rejected = responses.flatMap((r) => (r.kind?.$case === 'rejected' ? [r.kind.value] : []));
      expect(rejected).toHaveLength(1);
      expect(rejected[0]).toMatchObject({ taskId: '', field: 'task_id' });
      expect(responses.some((r) => r.kind?.$case === 'trajectory' && r.kind.value.taskId === 'id-after')).toBe(true);
    } finally {
      stream.client.close();
    }
  });
});

describe('metadata of absurd size', () => {
  let server: RolloutServer;
  beforeAll(async () => {
    server = await startRolloutServer({ port: 0, backends: [], tokenWorkers: { count: 0 }, auth: { token: 'bounds-token' } }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() });
  });
  afterAll(async () => server?.shutdown());

  /** Cancel with `metadata`: its status code, within a deadline (a call left without a status fails here). */
  const cancelWith = (metadata: Metadata): Promise<number> => {
    const client = new Client(server.address, credentials.createInsecure());
    return new Promise<number>((resolve) =>
      client.makeUnaryRequest('/rollout.v1.RolloutService/Cancel', (b: Uint8Array) => Buffer.from(b), (b: Buffer) => b, CancelRequest.encode({ taskId: 'nope' }).finish(), metadata, { deadline: Date.now() + 10_000 }, (err: ServiceError | null) =>
        resolve(err ? err.code : status.OK),
      ),
    ).finally(() => client.close());
  };
  const md = (entries: [string, string][]): Metadata => {
    const m = new Metadata();
    for (const [k, v] of entries) m.add(k, v);
    return m;
  };

  it('a 60 KB authorization header or a 1 MiB one is refused, never hangs, and the server serves the right token after', async () => {
    expect(await cancelWith(md([['authorization', `Bearer ${'x'.repeat(60_000)}`]]))).toBe(status.UNAUTHENTICATED);
    const huge = await cancelWith(md([['authorization', `Bearer ${'x'.repeat(1 << 20)}`]]));
    expect([status.UNAUTHENTICATED, status.INTERNAL, status.RESOURCE_EXHAUSTED, status.UNAVAILABLE]).toContain(huge);
    expect(await cancelWith(md(Array.from({ length: 5000 }, (_, i): [string, string] => [`x-${i}`, 'v'])))).not.toBe(status.DEADLINE_EXCEEDED);
    // The right token, after all that: Cancel of an unknown task.
    expect(await cancelWith(md([['authorization', 'Bearer bounds-token']]))).toBe(status.NOT_FOUND);
  });
});

describe('answers to bad requests hold a stream to its outbox bound like any other answer', () => {
  const OUTBOX = 64 * 1024;
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ sessions: { maxOutboxBytes: OUTBOX } });
  });
  afterAll(async () => h?.close());

  it('a client that writes 20,000 empty requests and does not read: the server stops reading at the bound, then answers every one', async () => {
    // A raw HTTP/2 client: grpc-js's own takes every message off the wire whether its caller reads or not.
    const connection = connect(`http://${h.server.address}`);
    try {
      const stream = connection.request({ ':method': 'POST', ':path': '/rollout.v1.RolloutService/Rollout', 'content-type': 'application/grpc', te: 'trailers' });
      const grpcStatus = new Promise<string>((resolve) => stream.on('trailers', (t) => resolve(String(t['grpc-status']))));
      stream.pause();
      const n = 20_000;
      stream.write(Buffer.alloc(5 * n)); // n empty gRPC messages: each is rejected naming `kind`
      const outbox = (): number => h.server.sessions.stats().outboxBytes;
      await eventually(() => outbox() >= OUTBOX, 'the outbox to fill');
      // The server is this process: its outbox is sampled at every chunk the client takes from here on.
      let most = outbox();
      let pending = Buffer.alloc(0);
      let rejected = 0;
      stream.on('data', (chunk: Buffer) => {
        most = Math.max(most, outbox());
        pending = Buffer.concat([pending, chunk]);
        while (pending.length >= 5 && pending.length >= 5 + pending.readUInt32BE(1)) {
          const r = RolloutResponse.decode(pending.subarray(5, 5 + pending.readUInt32BE(1)));
          if (r.kind?.$case === 'rejected' && r.kind.value.field === 'kind') rejected++;
          pending = pending.subarray(5 + pending.readUInt32BE(1));
        }
      });
      stream.resume();
      stream.end();
      expect(await grpcStatus).toBe(String(status.OK));
      expect(rejected).toBe(n);
      // One answer over the bound at most: it is checked before the next request is read.
      expect(most).toBeLessThanOrEqual(OUTBOX + 1024);
    } finally {
      connection.close();
    }
  });
});
