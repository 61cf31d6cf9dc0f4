import type { ServerWritableStream, ServerDuplexStream, ServiceDefinition } from '@grpc/grpc-js';
import { constants as http2Constants, type ServerHttp2Stream } from 'node:http2';
import { Duplex } from 'node:stream';

type WritableCall<T> = ServerWritableStream<unknown, T> | ServerDuplexStream<unknown, T>;

/** One queued message: an object the service's serializer encodes, or a run of messages already encoded. */
type Item<T> = { message: T; bytes: number } | EncodedRun;

/** Room of one run of encoded messages: small messages share it, so each costs its bytes and no object. */
const RUN_BYTES = 64 << 10;
/** An encoded message larger than this gets a run of its own, sized to fit. */
const RUN_MESSAGE_MAX = 16 << 10;
/** Bytes before each message in a run: its length. */
const LENGTH_PREFIX = 4;
/**
 * Bytes handed to grpc-js whose write has not completed (the HTTP/2 stream has not flushed them: the client's window
 * is shut) past which the next message waits. grpc-js's own bound is in messages (its writable high-water mark, 16):
 * 16 full trajectories of 512 KiB were 8 MiB per stalled stream outside any byte count. One message always goes.
 */
export const TRANSPORT_BYTES = 1 << 20;

/**
 * Encoded messages back to back in one buffer, each after its 4-byte length: thousands of queued stage events are
 * one allocation whose size is what the byte bound counts (as objects, each was a few hundred bytes of heap beside
 * its ~40 encoded ones). Read in order; the buffer is released when the run is taken off the queue.
 */
class EncodedRun {
  readonly #buffer: Buffer;
  #writeAt = 0;
  #readAt = 0;

  constructor(capacity: number) {
    this.#buffer = Buffer.allocUnsafeSlow(capacity);
  }

  /** Appends `bytes` when they fit; false when the run is full. */
  tryAppend(bytes: Uint8Array): boolean {
    if (this.#writeAt + LENGTH_PREFIX + bytes.length > this.#buffer.length) return false;
    this.#buffer.writeUInt32LE(bytes.length, this.#writeAt);
    this.#buffer.set(bytes, this.#writeAt + LENGTH_PREFIX);
    this.#writeAt += LENGTH_PREFIX + bytes.length;
    return true;
  }

  get isEmpty(): boolean {
    return this.#readAt >= this.#writeAt;
  }

  /** The next message's bytes (a view into the run) and what it counted. */
  shift(): { bytes: Buffer; counted: number } {
    const length = this.#buffer.readUInt32LE(this.#readAt);
    const bytes = this.#buffer.subarray(this.#readAt + LENGTH_PREFIX, this.#readAt + LENGTH_PREFIX + length);
    this.#readAt += LENGTH_PREFIX + length;
    return { bytes, counted: LENGTH_PREFIX + length };
  }
}

/**
 * The HTTP/2 stream under a grpc-js server call, or undefined when grpc-js no longer has the shape read here. grpc-js
 * (1.14) offers no public way to it nor to reset one call's stream (a status is the only way to end a call, and it
 * waits behind the call's unsent messages): the handler's call keeps its intercepting call in a private `call`, each
 * server interceptor's call wraps the next in a private `nextCall`, and the innermost (BaseServerInterceptingCall)
 * holds the stream in a private `stream`. The only reach into those internals; the stall tests
 * (test/contract/review-s35-stall-*.test.ts) fail when an upgrade moves them.
 */
export function http2StreamOf(call: object): ServerHttp2Stream | undefined {
  let at: unknown = (call as { call?: unknown }).call;
  // A few interceptors at most (ours are two); the bound only guards against a cycle in a changed shape.
  for (let hops = 0; hops < 16 && typeof at === 'object' && at !== null; hops++) {
    const stream = (at as { stream?: unknown }).stream;
    if (stream instanceof Duplex && typeof (stream as Partial<ServerHttp2Stream>).close === 'function' && typeof (stream as Partial<ServerHttp2Stream>).sendTrailers === 'function') {
      return stream as ServerHttp2Stream;
    }
    at = (at as { nextCall?: unknown }).nextCall;
  }
  return undefined;
}

/**
 * The least time a call ended for stalling is given to take its status before its stream is reset: a client merely
 * slow, or one under a config with a short `stalledMs`, still learns why its call ended and what to do.
 */
const STALL_RESET_MIN_MS = 10_000;

/**
 * The service with the response serializer of `paths` passing Buffers through as they are (a writer's
 * {@link StreamWriter.sendEncodedDroppable} messages) and encoding everything else as before.
 */
export function encodedResponsesPassThrough<S extends ServiceDefinition>(service: S, paths: readonly string[]): S {
  const out: Record<string, unknown> = {};
  for (const [name, method] of Object.entries(service)) {
    const serialize = method.responseSerialize as (message: unknown) => Buffer;
    out[name] = paths.includes(method.path) ? { ...method, responseSerialize: (message: unknown): Buffer => (Buffer.isBuffer(message) ? message : serialize(message)) } : method;
  }
  return out as S;
}

/**
 * Serialises writes to a server stream and respects backpressure: when `call.write()` returns false the next
 * message waits for 'drain'. Messages queue here meanwhile, counted in bytes (`sizeOf`, the encoded size): a count
 * bounds nothing when one trajectory is 1 KiB and the next 50 MiB. `queuedBytes` lets producers stop reading
 * requests when a client is slow, and `sendDroppable` refuses advisory messages past a bound, so the queue stays
 * bounded in bytes. After the call closes, writes are dropped.
 *
 * A writer may also queue messages already encoded ({@link sendEncodedDroppable}): they are kept as those bytes,
 * packed into shared runs, so what the bound counts is what the queue holds. The call's service must then pass
 * Buffers through its response serializer ({@link encodedResponsesPassThrough}).
 */
export class StreamWriter<T> {
  private readonly queue: Item<T>[] = [];
  /** Small control messages (opened, accepted, rejected) that go ahead of queued trajectories. */
  private readonly urgent: { message: T; bytes: number }[] = [];
  private bytes = 0;
  /** Bytes handed to grpc-js whose write has not completed (see TRANSPORT_BYTES). */
  private inTransport = 0;
  /** The pump's wait for room in the transport, re-checked when a write completes or the writer closes. */
  private roomCheck: (() => void) | undefined;
  private pumping = false;
  private closed = false;
  private readonly idleWaiters: (() => void)[] = [];
  private stall: { ms: number; fn: () => void } | undefined;

  constructor(
    private readonly call: WritableCall<T>,
    private readonly sizeOf: (message: T) => number = () => 1,
  ) {
    const close = (): void => this.discard();
    call.on('close', close);
    call.on('error', close);
    call.on('cancelled', close);
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Entries queued (both lanes; a run of encoded messages is one), not yet handed to the transport: 0 when idle. */
  get queued(): number {
    return this.queue.length + this.urgent.length;
  }

  /**
   * Bytes (by `sizeOf`) of the messages queued here and of those handed to the transport whose write has not completed
   * (grpc-js and the HTTP/2 stream hold them until the client's window takes them).
   */
  get queuedBytes(): number {
    return this.bytes + this.inTransport;
  }

  /** Bytes handed to the transport whose write has not completed. */
  get transportBytes(): number {
    return this.inTransport;
  }

  send(message: T): void {
    if (this.closed) return;
    this.enqueue(this.queue, message);
  }

  /**
   * Sends unless more than `limitBytes` are queued; returns whether it was queued. For advisory messages (stage
   * events) that a client which stopped reading may miss rather than grow the server.
   */
  sendDroppable(message: T, limitBytes: number): boolean {
    if (this.closed || this.queuedBytes > limitBytes) return false;
    this.enqueue(this.queue, message);
    return true;
  }

  /**
   * {@link sendDroppable} for a message already encoded: queued as its bytes (plus a 4-byte length, counted), packed
   * with the other encoded messages queued behind each other, and written as they are. Only for a call whose
   * service passes Buffers through ({@link encodedResponsesPassThrough}).
   */
  sendEncodedDroppable(encoded: Uint8Array, limitBytes: number): boolean {
    if (this.closed || this.queuedBytes > limitBytes) return false;
    const last = this.queue.at(-1);
    if (!(last instanceof EncodedRun && last.tryAppend(encoded))) {
      const run = new EncodedRun(encoded.length > RUN_MESSAGE_MAX ? LENGTH_PREFIX + encoded.length : RUN_BYTES);
      run.tryAppend(encoded);
      this.queue.push(run);
    }
    this.bytes += LENGTH_PREFIX + encoded.length;
    if (!this.pumping) void this.pump();
    return true;
  }

  /**
   * Sends ahead of everything queued but other urgent messages: a trainer waiting on `accepted` should not wait
   * behind thousands of trajectories when the server is busy.
   */
  sendUrgent(message: T): void {
    if (this.closed) return;
    this.enqueue(this.urgent, message);
  }

  /** Resolves when everything queued has been handed to the transport (or the call closed). */
  async flushed(): Promise<void> {
    while (!this.closed && (this.queued > 0 || this.pumping)) {
      await new Promise<void>((resolve) => this.idleWaiters.push(resolve));
    }
  }

  /** Resolves once at most `limitBytes` are queued, here and in the transport (or the call closed). */
  async below(limitBytes: number): Promise<void> {
    while (!this.closed && this.queuedBytes > limitBytes) {
      await new Promise<void>((resolve) => this.idleWaiters.push(resolve));
    }
  }

  /**
   * Calls `fn` when one write has waited `ms` for the transport to take it (the client's HTTP/2 window stayed shut:
   * it stopped reading). Once per blocked write; a write that goes through re-arms it.
   */
  onStall(ms: number, fn: () => void): void {
    this.stall = { ms, fn };
  }

  /**
   * For a call ended with a status because its client took no message for `stalledMs`: resets the call's HTTP/2 stream
   * (RST_STREAM ENHANCE_YOUR_CALM: grpc clients, grpc-js and grpc core alike, see RESOURCE_EXHAUSTED, the status it was
   * ended with, instead of a CANCELLED that reads as their own cancel) unless it closed within a grace, another `stalledMs` and at least
   * 10 s. The status waits behind the messages grpc-js and the stream hold (the client keeps its window shut), so the
   * stream and its buffers stayed, whatever slot was given up, as long as the client kept the connection; the reset
   * frees them and touches no other stream of the connection. With the grace equal to `stalledMs`, about as many ended
   * calls wait as there are live ones stalling. False when the stream cannot be reached ({@link http2StreamOf}): then
   * nothing is done.
   */
  resetUnlessClosedAfterStall(stalledMs: number): boolean {
    const stream = http2StreamOf(this.call);
    if (stream === undefined) return false;
    if (stream.closed || stream.destroyed) return true;
    const timer = setTimeout(() => {
      if (!stream.closed && !stream.destroyed) stream.close(http2Constants.NGHTTP2_ENHANCE_YOUR_CALM);
    }, Math.max(stalledMs, STALL_RESET_MIN_MS));
    timer.unref();
    stream.once('close', () => clearTimeout(timer));
    return true;
  }

  /**
   * Drops what is queued and takes nothing more, leaving the call open (its owner ends it with a status, which
   * grpc-js sends once the transport took what was handed to it). {@link flushed} and {@link below} resolve at once.
   */
  discard(): void {
    this.closed = true;
    this.queue.length = 0;
    this.urgent.length = 0;
    this.bytes = 0;
    this.roomCheck?.();
    this.wakeIdle();
  }

  end(): void {
    if (this.closed) return;
    this.closed = true;
    this.call.end();
  }

  private enqueue(lane: Item<T>[], message: T): void {
    const bytes = this.sizeOf(message);
    lane.push({ message, bytes });
    this.bytes += bytes;
    if (!this.pumping) void this.pump();
  }

  private async pump(): Promise<void> {
    this.pumping = true;
    try {
      while (this.queued > 0 && !this.closed) {
        const { message, bytes } = this.next();
        // Handed to grpc-js: it serializes at once and holds the bytes in the HTTP/2 stream's buffer until the
        // peer's flow-control window takes them; the write's callback says when. Past its high-water mark (16
        // messages) write() says false; past TRANSPORT_BYTES not completed, we wait too.
        this.inTransport += bytes;
        const room = this.call.write(message, () => this.written(bytes));
        if (!room || this.inTransport > TRANSPORT_BYTES) await this.transportRoom(!room);
        this.wakeIdle();
      }
    } finally {
      this.pumping = false;
      this.wakeIdle();
    }
  }

  /** A write handed to the transport completed (or failed: the call is ending): its bytes are no longer held. */
  private written(bytes: number): void {
    this.inTransport -= bytes;
    this.roomCheck?.();
    if (this.idleWaiters.length > 0) this.wakeIdle();
  }

  /** Takes the next message off the queue (urgent first), uncounting its bytes. */
  private next(): { message: T; bytes: number } {
    if (this.urgent.length > 0) {
      const item = this.urgent.shift()!;
      this.bytes -= item.bytes;
      return item;
    }
    const head = this.queue[0]!;
    if (head instanceof EncodedRun) {
      const { bytes, counted } = head.shift();
      if (head.isEmpty) this.queue.shift();
      this.bytes -= counted;
      // A Buffer where a T is expected: the service's serializer passes it through (encodedResponsesPassThrough).
      return { message: bytes as unknown as T, bytes: counted };
    }
    this.queue.shift();
    this.bytes -= head.bytes;
    return head;
  }

  /**
   * Resolves once the transport has room: its 'drain' came (when `needDrain`: write() said false) and at most
   * TRANSPORT_BYTES are held in writes not completed; or the call closed. A wait of stall.ms calls the stall handler.
   */
  private transportRoom(needDrain: boolean): Promise<void> {
    return new Promise((resolve) => {
      let drainPending = needDrain;
      const stall = this.stall;
      const timer = stall === undefined ? undefined : setTimeout(() => {
        if (!this.closed) stall.fn();
      }, stall.ms);
      const done = (): void => {
        clearTimeout(timer);
        this.call.off('drain', onDrain);
        this.call.off('close', done);
        this.call.off('error', done);
        this.roomCheck = undefined;
        resolve();
      };
      const check = (): void => {
        if (this.closed || (!drainPending && this.inTransport <= TRANSPORT_BYTES)) done();
      };
      const onDrain = (): void => {
        drainPending = false;
        check();
      };
      this.call.on('drain', onDrain);
      this.call.on('close', done);
      this.call.on('error', done);
      this.roomCheck = check;
      check();
    });
  }

  private wakeIdle(): void {
    for (const wake of this.idleWaiters.splice(0)) wake();
  }
}
