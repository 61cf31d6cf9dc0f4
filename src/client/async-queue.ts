/**
 * A single-consumer async queue that ends or fails once. `onLow`/`onHigh` let a producer pause its source while
 * the consumer is behind, so a slow consumer applies backpressure instead of growing the queue.
 */
export class AsyncQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private waiter: ((r: IteratorResult<T>) => void) | undefined;
  private failer: ((err: unknown) => void) | undefined;
  private ended = false;
  private error: unknown;

  constructor(
    private readonly highWater = 1024,
    private readonly onHigh: () => void = () => undefined,
    private readonly onLow: () => void = () => undefined,
  ) {}

  push(item: T): void {
    if (this.ended) return;
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = this.failer = undefined;
      w({ value: item, done: false });
      return;
    }
    this.items.push(item);
    if (this.items.length === this.highWater) this.onHigh();
  }

  end(error?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.error = error;
    if (this.waiter) {
      const w = this.waiter;
      const f = this.failer;
      this.waiter = this.failer = undefined;
      if (error !== undefined) f?.(error);
      else w({ value: undefined, done: true });
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return {
      next: () => {
        if (this.items.length > 0) {
          const value = this.items.shift()!;
          if (this.items.length === this.highWater >> 1) this.onLow();
          return Promise.resolve({ value, done: false });
        }
        if (this.ended) return this.error !== undefined ? Promise.reject(this.error) : Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve, reject) => {
          this.waiter = resolve;
          this.failer = reject;
        });
      },
      return: () => {
        this.end();
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }
}
