import { connect } from 'node:http2';
import { describe, expect, it } from 'vitest';
import { startRolloutServer } from '../../src/app.js';
import { silentLogger } from '../../src/observability/logger.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { encodeFields, len, utf8 } from '../support/wire-bytes.js';
import { eventually } from '../support/wait.js';

/**
 * Server reflection needs no token, and @grpc/reflection answers each request of its stream with `write` whatever it
 * returns: a client that writes requests and reads nothing had the server read them all (40,000 in under half a
 * second here) and queue an answer for each, without bound. Now the stream stops reading while its answers wait,
 * so HTTP/2 flow control holds the client back; once it reads, every request is answered.
 */
const K = 40_000;

describe('a reflection client that writes requests and never reads the answers', () => {
  it('is not read from while its answers wait; once it reads, every request is answered', async () => {
    const server = await startRolloutServer({ port: 0, backends: [], tokenWorkers: { count: 0 } }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() });
    const session = connect(`http://${server.address}`);
    session.on('error', () => undefined);
    try {
      const request = Buffer.from(encodeFields([len(4, utf8('rollout.v1.RolloutService'))])); // file_containing_symbol
      const frame = Buffer.concat([Buffer.from([0, 0, 0, 0, request.length]), request]);
      const stream = session.request({ ':method': 'POST', ':path': '/grpc.reflection.v1.ServerReflection/ServerReflectionInfo', 'content-type': 'application/grpc', te: 'trailers' });
      stream.on('error', () => undefined);
      stream.pause();
      let flushed = false;
      stream.write(Buffer.concat(Array<Buffer>(K).fill(frame)), () => (flushed = true));
      // Unbounded, the server took all 1.2 MB of requests within half a second. Bounded, it never does while nothing is read.
      await expect(eventually(() => flushed, 'the server reading every request', 10_000)).rejects.toThrow(/timed out/);

      // The client reads: every request is answered, in gRPC frames (5-byte prefix, then the message).
      let buffered = Buffer.alloc(0);
      let answers = 0;
      stream.on('data', (chunk: Buffer) => {
        buffered = Buffer.concat([buffered, chunk]);
        while (buffered.length >= 5 && buffered.length >= 5 + buffered.readUInt32BE(1)) {
          buffered = buffered.subarray(5 + buffered.readUInt32BE(1));
          answers++;
        }
      });
      stream.resume();
      await eventually(() => answers === K, `${K} answers`, 60_000);
      expect(flushed).toBe(true);
      stream.close();
    } finally {
      session.close();
      await server.shutdown();
    }
  }, 120_000);
});
