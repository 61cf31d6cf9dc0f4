import { connect, constants } from 'node:http2';
import { setTimeout as sleep } from 'node:timers/promises';
import { runInNewContext } from 'node:vm';
import { setFlagsFromString } from 'node:v8';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutRequest, WatchRequest } from '../../gen/ts/rollout/v1/rollout.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { bulkyEnvironment } from '../support/test-environments.js';
import { eventually } from '../support/wait.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const heldBytes = (): number => {
  gc();
  gc();
  const { heapUsed, arrayBuffers } = process.memoryUsage();
  return heapUsed + arrayBuffers;
};

const MiB = 1 << 20;
const STALLED_MS = 200;
/** The grace an ended stream gets to take its status (another stalledMs, at least 10 s: StreamWriter). */
const RESET_GRACE_MS = 10_000;

/** A gRPC message frame (uncompressed) around an encoded request. */
function frame(bytes: Uint8Array): Buffer {
  const out = Buffer.alloc(5 + bytes.length);
  out.writeUInt32BE(bytes.length, 1);
  out.set(bytes, 5);
  return out;
}

const task = (taskId: string, n: number): RolloutRequest => ({ kind: { $case: 'task', value: { taskId, environment: 'bulky', numSamples: 1, instance: { n }, metadata: {} } as never } });

describe('a Rollout stream ended for not reading, whose client still does not read', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({
      engine: { policy: () => 'done' },
      sandboxes: new NullSandboxDriver(),
      registry: defaultRegistry().register(bulkyEnvironment),
      config: { sessions: { maxUnackedBytes: 64 * MiB, stalledMs: STALLED_MS }, retainFinishedBytes: 4 * MiB, retainFinishedTasks: 4 },
    });
  });
  afterAll(async () => h?.close());

  it('is reset (RST_STREAM ENHANCE_YOUR_CALM: RESOURCE_EXHAUSTED to gRPC clients, not CANCELLED) once its grace passes, its session stays resumable, and a Watch on the same connection goes on', async () => {
    // A raw HTTP/2 client with a 1 KiB window: grpc-js's own takes every message off the wire whether its caller reads.
    const connection = connect(`http://${h.server.address}`, { settings: { initialWindowSize: 1024 } });
    connection.on('error', () => undefined);
    try {
      // A dashboard's Watch on the same connection, reading all along.
      const watch = connection.request({ ':method': 'POST', ':path': '/rollout.v1.RolloutService/Watch', 'content-type': 'application/grpc', te: 'trailers' });
      watch.on('error', () => undefined);
      let watched = 0;
      watch.on('data', (chunk: Buffer) => (watched += chunk.length));
      watch.end(frame(WatchRequest.encode({ environments: [], groupIds: [], fullTrajectories: false, stageEvents: false, statsIntervalMs: 100 }).finish()));
      await eventually(() => watched > 0, 'the watch to stream');

      // A trainer's stream that never reads: 512 KiB trajectories pile up behind its shut window.
      const before = heldBytes();
      const stalled = connection.request({ ':method': 'POST', ':path': '/rollout.v1.RolloutService/Rollout', 'content-type': 'application/grpc', te: 'trailers' });
      stalled.on('error', () => undefined);
      stalled.pause();
      stalled.write(frame(RolloutRequest.encode({ kind: { $case: 'open', value: { sessionId: 'never-reads', resume: false, stageEvents: true } } }).finish()));
      for (let i = 0; i < 24; i++) stalled.write(frame(RolloutRequest.encode(task(`nr-${i}`, i)).finish()));
      await eventually(() => h.server.sessions.get('never-reads') !== undefined, 'the session to open');
      const session = h.server.sessions.get('never-reads')!;
      await eventually(() => !session.isAttached, 'the stalled stream to be ended', 30_000);
      const endedAt = Date.now();
      await eventually(() => h.server.runtime.pipeline.inFlight === 0 && session.pending === 0, 'the accepted work to finish', 30_000);
      const whileEnded = heldBytes() - before;
      // Within its grace, the ended stream is still there for its client to take the status from.
      expect(stalled.closed).toBe(false);

      await sleep(Math.max(0, endedAt + RESET_GRACE_MS + 1_500 - Date.now()));
      const afterReset = heldBytes() - before;
      console.log(`stalled Rollout stream, ended: heap+buffers +${(whileEnded / MiB).toFixed(1)} MiB; ${stalled.closed ? `reset (rstCode ${stalled.rstCode})` : 'still open'} after its grace: +${(afterReset / MiB).toFixed(1)} MiB (session holds ${(session.unackedBytes / MiB).toFixed(1)} MiB unacked)`);
      expect(stalled.closed, 'the ended stream is still open: its HTTP/2 stream (and buffers) kept (grpc-js internals changed? see http2StreamOf)').toBe(true);
      expect(stalled.rstCode).toBe(constants.NGHTTP2_ENHANCE_YOUR_CALM);
      // Its session is resumable with what it owes (the reset ends the stream, not the session).
      expect(h.server.sessions.get('never-reads')?.unackedCount).toBeGreaterThan(0);
      // The Watch on the same connection was not touched.
      const seen = watched;
      await eventually(() => watched > seen, 'the watch to go on streaming');
      expect(watch.closed).toBe(false);
      expect(connection.destroyed).toBe(false);
    } finally {
      connection.destroy();
    }
  }, 90_000);
});
