import type { ServerWritableStream, ServerDuplexStream } from '@grpc/grpc-js';

type WritableCall<T> = ServerWritableStream<unknown, T> | ServerDuplexStream<unknown, T>;

/**
 * Serialises writes to a server stream and respects backpressure: when `call.write()` returns false the next
 * message waits for 'drain'. Messages queue here meanwhile, counted in bytes (`sizeOf`, the encoded size): a count
 * bounds nothing when one trajectory is 1 KiB and the next 50 MiB. `queuedBytes` lets producers stop reading
 * requests when a client is slow, and `sendDroppable` refuses advisory messages past a bound, so the queue stays
 * bounded in bytes. After the call closes, writes are dropped.
 */
export class StreamWriter<T> {
  private readonly queue: { message: T; bytes: number }[] = [];
  /** Small control messages (opened, accepted, rejected) that go ahead of queued trajectories. */
  private readonly urgent: { message: T; bytes: number }[] = [];
  private bytes = 0;
  private pumping = false;
  private closed = false;
  private readonly idleWaiters: (() => void)[] = [];

  constructor(
    private readonly call: WritableCall<T>,
    private readonly sizeOf: (message: T) => number = () => 1,
  ) {
    const close = (): void => {
      this.closed = true;
      this.queue.length = 0;
      this.urgent.length = 0;
      this.bytes = 0;
      this.wakeIdle();
    };
    call.on('close', close);
    call.on('error', close);
    call.on('cancelled', close);
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Messages queued (both lanes), not yet handed to the transport. */
  get queued(): number {
    return this.queue.length + this.urgent.length;
  }

  /** Bytes (by `sizeOf`) of the messages queued, not yet handed to the transport. */
  get queuedBytes(): number {
    return this.bytes;
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
    if (this.closed || this.bytes > limitBytes) return false;
    this.enqueue(this.queue, message);
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

  /** Resolves once at most `limitBytes` are queued (or the call closed). */
  async below(limitBytes: number): Promise<void> {
    while (!this.closed && this.bytes > limitBytes) {
      await new Promise<void>((resolve) => this.idleWaiters.push(resolve));
    }
  }

  end(): void {
    if (this.closed) return;
    this.closed = true;
    this.call.end();
  }

  private enqueue(lane: { message: T; bytes: number }[], message: T): void {
    const bytes = this.sizeOf(message);
    lane.push({ message, bytes });
    this.bytes += bytes;
    if (!this.pumping) void this.pump();
  }

  private async pump(): Promise<void> {
    this.pumping = true;
    try {
      while (this.queued > 0 && !this.closed) {
        const item = this.urgent.length > 0 ? this.urgent.shift()! : this.queue.shift()!;
        this.bytes -= item.bytes;
        // Handed to grpc-js: it serializes at once and holds the bytes in the HTTP/2 stream's buffer until the
        // peer's flow-control window takes them; past its high-water mark write() says false and we wait.
        if (!this.call.write(item.message)) await this.drained();
        this.wakeIdle();
      }
    } finally {
      this.pumping = false;
      this.wakeIdle();
    }
  }

  private drained(): Promise<void> {
    return new Promise((resolve) => {
      const done = (): void => {
        this.call.off('drain', done);
        this.call.off('close', done);
        this.call.off('error', done);
        resolve();
      };
      this.call.on('drain', done);
      this.call.on('close', done);
      this.call.on('error', done);
    });
  }

  private wakeIdle(): void {
    for (const wake of this.idleWaiters.splice(0)) wake();
  }
}
