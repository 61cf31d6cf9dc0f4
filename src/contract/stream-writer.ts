import type { ServerWritableStream, ServerDuplexStream } from '@grpc/grpc-js';

type WritableCall<T> = ServerWritableStream<unknown, T> | ServerDuplexStream<unknown, T>;

/**
 * Serialises writes to a server stream and respects backpressure: when `call.write()` returns false the next
 * message waits for 'drain'. Messages queue here meanwhile; `queued` lets producers stop reading requests when
 * a client is slow, so the queue stays bounded. After the call closes, writes are dropped.
 */
export class StreamWriter<T> {
  private readonly queue: T[] = [];
  /** Small control messages (opened, accepted, rejected) that go ahead of queued trajectories. */
  private readonly urgent: T[] = [];
  private pumping = false;
  private closed = false;
  private readonly idleWaiters: (() => void)[] = [];

  constructor(private readonly call: WritableCall<T>) {
    const close = (): void => {
      this.closed = true;
      this.queue.length = 0;
      this.urgent.length = 0;
      this.wakeIdle();
    };
    call.on('close', close);
    call.on('error', close);
    call.on('cancelled', close);
  }

  get isClosed(): boolean {
    return this.closed;
  }

  get queued(): number {
    return this.queue.length;
  }

  send(message: T): void {
    if (this.closed) return;
    this.queue.push(message);
    if (!this.pumping) void this.pump();
  }

  /**
   * Sends ahead of everything queued but other urgent messages: a trainer waiting on `accepted` should not wait
   * behind thousands of trajectories when the server is busy.
   */
  sendUrgent(message: T): void {
    if (this.closed) return;
    this.urgent.push(message);
    if (!this.pumping) void this.pump();
  }

  /** Resolves when everything queued has been handed to the transport (or the call closed). */
  async flushed(): Promise<void> {
    while (!this.closed && (this.queue.length > 0 || this.urgent.length > 0 || this.pumping)) {
      await new Promise<void>((resolve) => this.idleWaiters.push(resolve));
    }
  }

  /** Resolves once fewer than `limit` messages are queued. */
  async below(limit: number): Promise<void> {
    while (!this.closed && this.queue.length >= limit) {
      await new Promise<void>((resolve) => this.idleWaiters.push(resolve));
    }
  }

  end(): void {
    if (this.closed) return;
    this.closed = true;
    this.call.end();
  }

  private async pump(): Promise<void> {
    this.pumping = true;
    try {
      while ((this.urgent.length > 0 || this.queue.length > 0) && !this.closed) {
        const message = this.urgent.length > 0 ? this.urgent.shift()! : this.queue.shift()!;
        if (!this.call.write(message)) await this.drained();
        if (this.queue.length < 64) this.wakeIdle();
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
