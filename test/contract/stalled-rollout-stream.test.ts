import { runInNewContext } from 'node:vm';
import { setFlagsFromString } from 'node:v8';
import { credentials, status, type ClientDuplexStream, type ServiceError } from '@grpc/grpc-js';
import { connect, type ClientHttp2Stream } from 'node:http2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutRequest, RolloutResponse, RolloutServiceClient, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { bulkyEnvironment } from '../support/test-environments.js';
import { eventually, within } from '../support/wait.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const heapUsed = (): number => {
  gc();
  gc();
  return process.memoryUsage().heapUsed + process.memoryUsage().arrayBuffers;
};

const MiB = 1 << 20;
const STALLED_MS = 1_000;

const task = (taskId: string, n: number): RolloutRequest => ({ kind: { $case: 'task', value: { taskId, environment: 'bulky', numSamples: 1, instance: { n }, metadata: {} } as never } });

/** A gRPC message frame (uncompressed) around a request. */
function frame(request: RolloutRequest): Buffer {
  const bytes = RolloutRequest.encode(request).finish();
  const out = Buffer.alloc(5 + bytes.length);
  out.writeUInt32BE(bytes.length, 1);
  out.set(bytes, 5);
  return out;
}

/** Reads a raw HTTP/2 gRPC stream to its end: its responses (decoded) and the status in its trailers. */
function readRaw(stream: ClientHttp2Stream): Promise<{ responses: RolloutResponse[]; status: number; message: string }> {
  const chunks: Buffer[] = [];
  let trailers: Record<string, unknown> = {};
  stream.on('data', (chunk: Buffer) => chunks.push(chunk));
  // Trailers come after every message (the client has not half-closed: its side stays open until it does).
  const ended = new Promise<void>((resolve) => {
    stream.on('trailers', (t) => {
      trailers = t;
      resolve();
    });
    stream.on('close', () => resolve());
  });
  stream.resume();
  return ended.then(() => {
    const all = Buffer.concat(chunks);
    const responses: RolloutResponse[] = [];
    for (let at = 0; at + 5 <= all.length; ) {
      const length = all.readUInt32BE(at + 1);
      responses.push(RolloutResponse.decode(all.subarray(at + 5, at + 5 + length)));
      at += 5 + length;
    }
    return { responses, status: Number(trailers['grpc-status']), message: decodeURIComponent(String(trailers['grpc-message'] ?? '')) };
  });
}

/** Reads a stream to its end: what it got, and the status it ended with. */
function readToEnd(call: ClientDuplexStream<RolloutRequest, RolloutResponse>): Promise<{ responses: RolloutResponse[]; error: ServiceError | undefined }> {
  const responses: RolloutResponse[] = [];
  return new Promise((resolve) => {
    call.on('data', (r: RolloutResponse) => responses.push(r));
    call.on('error', (error: ServiceError) => resolve({ responses, error }));
    call.on('end', () => resolve({ responses, error: undefined }));
  });
}

describe('a Rollout stream whose client stopped reading', () => {
  let h: ServerHarness;
  let grpc: InstanceType<typeof RolloutServiceClient>;
  beforeAll(async () => {
    h = await startServerHarness({
      engine: { policy: () => 'done' },
      sandboxes: new NullSandboxDriver(),
      registry: defaultRegistry().register(bulkyEnvironment),
      config: { sessions: { maxUnackedBytes: 64 * MiB, stalledMs: STALLED_MS }, retainFinishedBytes: 4 * MiB, retainFinishedTasks: 4 },
    });
    grpc = new RolloutServiceClient(h.server.address, credentials.createInsecure());
  });
  afterAll(async () => {
    grpc?.close();
    await h?.close();
  });

  it('is ended RESOURCE_EXHAUSTED after sessions.stalledMs, what it held is released, and a resume gets every trajectory', async () => {
    const before = heapUsed();
    // A raw HTTP/2 client with a 1 KiB window that never reads (grpc-js's own takes every message off the wire whether
    // its caller reads or not): the server's writes to it block, as for a trainer whose TCP window is full.
    const connection = connect(`http://${h.server.address}`, { settings: { initialWindowSize: 1024 } });
    connection.on('error', () => undefined);
    const stalled = connection.request({ ':method': 'POST', ':path': '/rollout.v1.RolloutService/Rollout', 'content-type': 'application/grpc', te: 'trailers' });
    stalled.on('error', () => undefined);
    stalled.pause();
    stalled.write(frame({ kind: { $case: 'open', value: { sessionId: 'stops-reading', resume: false, stageEvents: true } } }));
    for (let i = 0; i < 40; i++) stalled.write(frame(task(`sr-${i}`, i)));
    await eventually(() => h.server.sessions.get('stops-reading') !== undefined, 'the session to open');
    const session = h.server.sessions.get('stops-reading')!;
    // Everything the server read of it runs; the stream is then ended for not reading.
    await eventually(() => !session.isAttached, 'the stalled stream to be ended', 30_000);
    await eventually(() => h.server.runtime.pipeline.inFlight === 0 && session.pending === 0, 'the accepted work to finish', 30_000);
    const owed = session.unackedCount;
    expect(owed).toBeGreaterThan(0);
    // What stays is the session's unacked trajectories (their wire bytes, for the resume): the stream's queue is gone.
    expect(session.outboxBytes).toBe(0);
    const held = heapUsed() - before;
    console.log(`stalled stream ended: session owes ${owed} trajectories (${(session.unackedBytes / MiB).toFixed(1)} MiB), heap+buffers +${(held / MiB).toFixed(1)} MiB`);
    expect(held).toBeLessThan(session.unackedBytes + 16 * MiB);

    // The client reads again: what was in flight to it, then the status saying why and what to do.
    const old = await within(readRaw(stalled), 30_000, 'the old stream to end');
    expect(old.status).toBe(status.RESOURCE_EXHAUSTED);
    expect(old.message).toContain('sessions.stalledMs');
    expect(old.message).toContain('resume');
    connection.destroy();
    // Answers still queued when it was ended were dropped with the queue: the client re-sends specs it has no answer
    // for (a duplicate), and the resume brings their trajectories anyway.
    const accepted = old.responses.flatMap((r) => (r.kind?.$case === 'accepted' ? [r.kind.value.taskId] : []));
    expect(accepted.length).toBeGreaterThan(0);

    // A resume gets every trajectory of every task the stream was answered `accepted` for: none lost.
    const resumed = grpc.rollout();
    const got = readToEnd(resumed);
    resumed.write({ kind: { $case: 'open', value: { sessionId: 'stops-reading', resume: true, stageEvents: false } } });
    await eventually(() => h.server.sessions.get('stops-reading')!.isAttached, 'the resume');
    resumed.end();
    const { responses, error } = await within(got, 30_000, 'the resumed stream');
    const trajectories = responses.flatMap((r) => (r.kind?.$case === 'trajectory' ? [r.kind.value] : []));
    for (const t of trajectories) expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
    const resumedIds = new Set(trajectories.map((t) => t.taskId));
    expect(resumedIds.size).toBe(owed);
    expect(trajectories.length).toBe(owed);
    for (const id of accepted) expect(resumedIds.has(id)).toBe(true);
    expect(error).toBeUndefined();
  }, 90_000);
});

describe('a Rollout stream whose client stopped reading, before it is ended', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({
      engine: { policy: () => 'done' },
      sandboxes: new NullSandboxDriver(),
      registry: defaultRegistry().register(bulkyEnvironment),
      config: { sessions: { maxUnackedBytes: 64 * MiB, stalledMs: 0 }, retainFinishedBytes: 4 * MiB, retainFinishedTasks: 4 },
    });
  });
  afterAll(async () => h?.close());

  it('holds its queued trajectories as their wire bytes (once, shared with the session), not as objects beside them', async () => {
    const before = heapUsed();
    const connection = connect(`http://${h.server.address}`, { settings: { initialWindowSize: 1024 } });
    connection.on('error', () => undefined);
    const stalled = connection.request({ ':method': 'POST', ':path': '/rollout.v1.RolloutService/Rollout', 'content-type': 'application/grpc', te: 'trailers' });
    stalled.on('error', () => undefined);
    stalled.pause();
    stalled.write(frame({ kind: { $case: 'open', value: { sessionId: 'queued', resume: false, stageEvents: false } } }));
    for (let i = 0; i < 24; i++) stalled.write(frame(task(`q-${i}`, i)));
    await eventually(() => h.server.sessions.get('queued') !== undefined, 'the session to open');
    const session = h.server.sessions.get('queued')!;
    await eventually(() => h.server.runtime.pipeline.inFlight === 0 && session.pending === 0 && session.unackedCount > 0, 'the accepted work to finish', 30_000);
    // Its queue holds what it could not send (counted as the trajectories' encoded bytes, which the session holds too).
    expect(session.outboxBytes).toBeGreaterThan(0);
    const held = heapUsed() - before;
    console.log(`stalled, not ended: ${session.unackedCount} trajectories (${(session.unackedBytes / MiB).toFixed(1)} MiB) unacked, ${(session.outboxBytes / MiB).toFixed(1)} MiB queued, heap+buffers +${(held / MiB).toFixed(1)} MiB`);
    expect(held).toBeLessThan(1.25 * session.unackedBytes + 4 * MiB);
    connection.destroy();
    await eventually(() => !session.isAttached, 'the stream to end');
  }, 60_000);
});

