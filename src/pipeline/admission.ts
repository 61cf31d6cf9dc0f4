/**
 * Bounded admission: at most `capacity` samples are admitted (queued or in a stage) at once. Producers await
 * `admit(n)` before submitting, which is how a Rollout stream stops reading requests when the server is full
 * (the handler does not pull the next message until admission resolves, so gRPC flow control pushes back on
 * the client instead of the server buffering without limit). Waiters are served in FIFO order.
 */
export class Admission {
  private admitted = 0;
  private readonly waiters: { n: number; resolve: () => void; reject: (err: unknown) => void }[] = [];

  constructor(readonly capacity: number) {}

  get inFlight(): number {
    return this.admitted;
  }

  get waiting(): number {
    return this.waiters.length;
  }

  /** Resolves once n samples fit. A request larger than capacity is admitted alone when nothing else is in. */
  admit(n: number, signal?: AbortSignal): Promise<void> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.waiters.length === 0 && this.fits(n)) {
      this.admitted += n;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const onAbort = (): void => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) {
          this.waiters.splice(i, 1);
          reject(signal!.reason);
          this.drain();
        }
      };
      // The listener goes when the waiter is admitted, so a long-lived stream signal does not collect them.
      const waiter = {
        n,
        resolve: () => {
          signal?.removeEventListener('abort', onAbort);
          resolve();
        },
        reject,
      };
      this.waiters.push(waiter);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  release(n: number): void {
    this.admitted = Math.max(0, this.admitted - n);
    this.drain();
  }

  private fits(n: number): boolean {
    return this.admitted + n <= this.capacity || this.admitted === 0;
  }

  private drain(): void {
    while (this.waiters.length > 0 && this.fits(this.waiters[0]!.n)) {
      const waiter = this.waiters.shift()!;
      this.admitted += waiter.n;
      waiter.resolve();
    }
  }
}
