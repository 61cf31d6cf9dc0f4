import { connect } from 'node:http2';
import { Server, ServerCredentials, type ServerWritableStream, type ServiceDefinition } from '@grpc/grpc-js';
import { afterEach, describe, expect, it } from 'vitest';
import { StreamWriter, TRANSPORT_BYTES } from '../../src/contract/stream-writer.js';
import { eventually } from '../support/wait.js';

// grpc-js bounds what it holds for a stream in messages (its writable high-water mark, 16), not bytes: a client that
// stopped reading had up to 16 messages handed over outside StreamWriter's byte count (8 MiB of 512 KiB full
// trajectories per stalled Watch or Rollout stream). StreamWriter now counts what it handed over until grpc-js says the
// write completed (the HTTP/2 stream flushed it) and waits past TRANSPORT_BYTES. A real grpc-js server and a raw HTTP/2
// client that keeps its window shut: no double between them.

const MESSAGE = 256 << 10;
const MESSAGES = 20;
const identity = (b: Buffer): Buffer => b;
const service: ServiceDefinition = {
  stream: {
    path: '/test.Bytes/Stream',
    requestStream: false,
    responseStream: true,
    requestSerialize: identity,
    requestDeserialize: identity,
    responseSerialize: identity,
    responseDeserialize: identity,
  },
};

let server: Server | undefined;
afterEach(() => server?.forceShutdown());

describe('StreamWriter against a client that does not read', () => {
  it('hands grpc-js at most TRANSPORT_BYTES (plus one message) of writes not completed; all of them arrive once the client reads', async () => {
    let writer: StreamWriter<Buffer> | undefined;
    server = new Server();
    server.addService(service, {
      stream: (call: ServerWritableStream<Buffer, Buffer>) => {
        writer = new StreamWriter<Buffer>(call, (b) => b.length);
        for (let i = 0; i < MESSAGES; i++) writer.send(Buffer.alloc(MESSAGE, i));
        void writer.flushed().then(() => writer!.end());
      },
    });
    const port = await new Promise<number>((resolve, reject) => server!.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
    const client = connect(`http://127.0.0.1:${port}`, { settings: { initialWindowSize: 1024 } });
    client.on('error', () => undefined);
    try {
      const stream = client.request({ ':method': 'POST', ':path': '/test.Bytes/Stream', 'content-type': 'application/grpc', te: 'trailers' });
      stream.on('error', () => undefined);
      stream.pause();
      stream.end(Buffer.from([0, 0, 0, 0, 0])); // one empty request message
      await eventually(() => writer !== undefined && writer.queued < MESSAGES, 'the writer to hand over its first messages');
      // Let the transport take what it will: the client's window (1 KiB) and socket buffers take little of it.
      await new Promise((resolve) => setTimeout(resolve, 500));
      const handedOver = (MESSAGES - writer!.queued) * MESSAGE;
      expect(handedOver).toBeLessThanOrEqual(TRANSPORT_BYTES + MESSAGE);
      expect(writer!.transportBytes).toBeGreaterThan(0);
      expect(writer!.queuedBytes).toBe(MESSAGES * MESSAGE - (handedOver - writer!.transportBytes));
      // The client reads (its stream window opened to 1 MiB): every message arrives, whole and in order, and nothing
      // is left counted.
      client.settings({ initialWindowSize: 1 << 20 });
      let body = Buffer.alloc(0);
      stream.on('data', (chunk: Buffer) => (body = Buffer.concat([body, chunk])));
      stream.resume();
      await new Promise<void>((resolve) => stream.on('end', resolve));
      expect(body.length).toBe(MESSAGES * (5 + MESSAGE));
      for (let i = 0; i < MESSAGES; i++) {
        const at = i * (5 + MESSAGE);
        expect(body.readUInt32BE(at + 1)).toBe(MESSAGE);
        expect(body[at + 5]).toBe(i);
        expect(body[at + 5 + MESSAGE - 1]).toBe(i);
      }
      expect(writer!.queuedBytes).toBe(0);
    } finally {
      client.close();
    }
  }, 30_000);
});
