import { EventEmitter } from 'node:events';
import type { ServerWritableStream, ServiceDefinition } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { encodedResponsesPassThrough, StreamWriter } from '../../src/contract/stream-writer.js';

/**
 * A server stream whose transport takes nothing until `drain()` is called: write() says false each time, and a write
 * completes (its callback is called, as grpc-js does once the HTTP/2 stream flushed it) only at the next drain.
 */
class StalledCall extends EventEmitter {
  readonly written: unknown[] = [];
  private pending: (() => void)[] = [];
  write(message: unknown, done?: () => void): boolean {
    this.written.push(message);
    if (done) this.pending.push(done);
    return false;
  }
  drain(): void {
    for (const done of this.pending.splice(0)) done();
    this.emit('drain');
  }
  end(): void {}
}

const flush = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

describe('StreamWriter: encoded messages', () => {
  it('queues encoded messages as their bytes, counted with a 4-byte length, in order with object messages', async () => {
    const call = new StalledCall();
    const writer = new StreamWriter<{ text: string }>(call as unknown as ServerWritableStream<unknown, { text: string }>, (m) => m.text.length);
    // The first message goes to the transport at once (and counts until its write completes); the rest wait for 'drain'.
    expect(writer.sendEncodedDroppable(Buffer.from('first'), 1 << 20)).toBe(true);
    expect(writer.sendEncodedDroppable(Buffer.from('second'), 1 << 20)).toBe(true);
    writer.send({ text: 'object' });
    expect(writer.sendEncodedDroppable(Buffer.from('third!'), 1 << 20)).toBe(true);
    const big = Buffer.alloc(40_000, 7); // over a run's per-message size: a run of its own
    expect(writer.sendEncodedDroppable(big, 1 << 20)).toBe(true);
    expect(writer.queuedBytes).toBe(4 + 5 + 4 + 6 + 6 + 4 + 6 + 4 + 40_000);
    await flush();
    for (let i = 0; i < 5; i++) {
      call.drain();
      await flush();
    }
    expect(call.written.map((m) => (Buffer.isBuffer(m) ? m.length > 100 ? `${m.length} bytes` : m.toString() : m))).toEqual(['first', 'second', { text: 'object' }, 'third!', '40000 bytes']);
    expect(Buffer.compare(call.written[4] as Buffer, big)).toBe(0);
    expect(writer.queuedBytes).toBe(0);
  });

  it('drops encoded messages past the bound (what it counts is what it holds)', async () => {
    const call = new StalledCall();
    const writer = new StreamWriter<never>(call as unknown as ServerWritableStream<unknown, never>);
    const event = Buffer.alloc(40, 1);
    let queued = 0;
    for (let i = 0; i < 10_000; i++) if (writer.sendEncodedDroppable(event, 64 << 10)) queued++;
    // One is with the transport (its write not completed, so counted); the rest are held until the bound (64 KiB) is
    // passed, then dropped.
    expect(queued).toBe(Math.floor((64 << 10) / 44) + 1);
    expect(writer.queuedBytes).toBeLessThanOrEqual((64 << 10) + 44);
    await flush();
  });

  it('a pass-through serializer writes Buffers as they are and encodes everything else as before', () => {
    const service = {
      watch: { path: '/s/Watch', responseSerialize: (m: { n: number }) => Buffer.from(`n=${m.n}`) },
      other: { path: '/s/Other', responseSerialize: (m: { n: number }) => Buffer.from(`n=${m.n}`) },
    } as unknown as ServiceDefinition;
    const wrapped = encodedResponsesPassThrough(service, ['/s/Watch']);
    const bytes = Buffer.from([1, 2, 3]);
    expect(wrapped.watch!.responseSerialize(bytes)).toBe(bytes);
    expect(wrapped.watch!.responseSerialize({ n: 1 }).toString()).toBe('n=1');
    expect(wrapped.other).toBe(service.other);
  });
});
