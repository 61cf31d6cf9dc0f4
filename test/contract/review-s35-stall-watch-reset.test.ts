import { connect, constants, type ClientHttp2Session, type ClientHttp2Stream } from 'node:http2';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WatchRequest, WatchResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { http2StreamOf } from '../../src/contract/stream-writer.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

const STALLED_MS = 200;
const MAX_OPEN = 2;
/** Watches opened on the connection that never read: each is ended for it, and the next one takes its slot. */
const STALLED_WATCHES = 4;
/** The grace an ended watch gets to take its status (another stalledMs, at least 10 s: StreamWriter). */
const RESET_GRACE_MS = 10_000;

/** A gRPC message frame (uncompressed) around a Watch request. */
function frame(request: WatchRequest): Buffer {
  const bytes = WatchRequest.encode(request).finish();
  const out = Buffer.alloc(5 + bytes.length);
  out.writeUInt32BE(bytes.length, 1);
  out.set(bytes, 5);
  return out;
}

const statsEvery100Ms: WatchRequest = { environments: [], groupIds: [], fullTrajectories: false, stageEvents: false, statsIntervalMs: 100 };

interface RawWatch {
  stream: ClientHttp2Stream;
  /** The grpc-status of a trailers-only answer (a refusal), undefined while none came. */
  refused: () => number | undefined;
  /** Messages taken (only by a watch that reads). */
  received: () => number;
}

/** A Watch over a raw HTTP/2 stream: paused (never reads: its 1 KiB window stays shut) unless `read`. */
function rawWatch(connection: ClientHttp2Session, read: boolean): RawWatch {
  const stream = connection.request({ ':method': 'POST', ':path': '/rollout.v1.RolloutService/Watch', 'content-type': 'application/grpc', te: 'trailers' });
  stream.on('error', () => undefined);
  let refused: number | undefined;
  let received = 0;
  stream.on('response', (headers) => {
    if (headers['grpc-status'] !== undefined) refused = Number(headers['grpc-status']);
  });
  if (read) {
    let pending = Buffer.alloc(0);
    stream.on('data', (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      while (pending.length >= 5 && pending.length >= 5 + pending.readUInt32BE(1)) {
        WatchResponse.decode(pending.subarray(5, 5 + pending.readUInt32BE(1)));
        pending = pending.subarray(5 + pending.readUInt32BE(1));
        received++;
      }
    });
  } else {
    stream.pause();
  }
  stream.end(frame(statsEvery100Ms));
  return { stream, refused: () => refused, received: () => received };
}

describe('a Watch stream ended for not reading, whose client still does not read', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({ engine: { policy: () => 'done' }, sandboxes: new NullSandboxDriver(), config: { watch: { maxOpen: MAX_OPEN, stalledMs: STALLED_MS } } });
  });
  afterAll(async () => h?.close());

  it('is reset (RST_STREAM ENHANCE_YOUR_CALM: RESOURCE_EXHAUSTED to gRPC clients, not CANCELLED) once its grace passes, and the connection\u2019s other streams go on', async () => {
    const connection = connect(`http://${h.server.address}`, { settings: { initialWindowSize: 1024 } });
    connection.on('error', () => undefined);
    try {
      // A dashboard's watch on the same connection, reading all along: it holds one of the two slots.
      const reader = rawWatch(connection, true);
      await eventually(() => reader.received() > 0, 'the reading watch to get stats');
      // A client opening watches and never reading: each one stalls, is ended, and its slot serves the next.
      const stalled: RawWatch[] = [];
      while (stalled.length < STALLED_WATCHES) {
        const next = rawWatch(connection, false);
        await eventually(() => next.refused() !== undefined || !next.stream.closed, 'the watch to be answered');
        await sleep(50);
        if (next.refused() === undefined && !next.stream.closed) stalled.push(next);
        else await sleep(100);
      }
      const ended = stalled.slice(0, -1);
      // Each but the last was ended (its successor got the slot); what each was ended with is still not taken.
      // The grace and a margin later, they must be gone from the transport.
      await sleep(RESET_GRACE_MS + 2 * STALLED_MS + 1_500);
      const open = stalled.filter((w) => !w.stream.closed).length;
      const { arrayBuffers, heapUsed } = process.memoryUsage();
      console.log(`${stalled.length} stalled watches on one connection (maxOpen ${MAX_OPEN}, stalledMs ${STALLED_MS}): ${open} streams still open; heap ${(heapUsed / 2 ** 20).toFixed(1)} MiB, buffers ${(arrayBuffers / 2 ** 20).toFixed(1)} MiB`);
      for (const [i, watch] of ended.entries()) {
        expect(watch.stream.closed, `stalled watch ${i} still open: ended, but its HTTP/2 stream (and buffers) kept (grpc-js internals changed? see http2StreamOf)`).toBe(true);
        expect(watch.stream.rstCode).toBe(constants.NGHTTP2_ENHANCE_YOUR_CALM);
      }
      // The reading watch on the same connection was not touched: still open, still receiving.
      const before = reader.received();
      await eventually(() => reader.received() > before + 2, 'the reading watch to go on receiving stats');
      expect(reader.stream.closed).toBe(false);
      expect(connection.closed || connection.destroyed).toBe(false);
    } finally {
      connection.destroy();
    }
  }, 60_000);
});

describe('reaching the HTTP/2 stream under a grpc-js call (http2StreamOf)', () => {
  it('finds nothing, and so nothing is reset, in a call of another shape', () => {
    expect(http2StreamOf({})).toBeUndefined();
    expect(http2StreamOf({ call: { nextCall: { stream: { close: () => undefined } } } })).toBeUndefined();
    const cycle: { nextCall?: unknown } = {};
    cycle.nextCall = cycle;
    expect(http2StreamOf({ call: cycle })).toBeUndefined();
  });
});
