import { RolloutError } from '../../errors.js';

interface Waiter<T> {
  resolve: (slot: T) => void;
  reject: (err: unknown) => void;
  signal: AbortSignal;
  onAbort: () => void;
}

/**
 * A fixed set of reusable slots (the context sequences of one embedded model) handed out in FIFO order: requests
 * beyond the slots wait, abortably, instead of failing. Invariants: a slot is held by at most one caller; every
 * released slot goes to the oldest waiter still waiting, else back to the free list; an aborted waiter leaves the
 * queue at once with its signal's reason; `close` rejects every waiter and refuses later acquires.
 */
export class SequenceSlots<T> {
  readonly #free: T[];
  readonly #waiters: Waiter<T>[] = [];
  #closed = false;

  constructor(slots: readonly T[]) {
    this.#free = [...slots];
  }

  /** Requests waiting for a slot. */
  get waiting(): number {
    return this.#waiters.length;
  }

  acquire(signal: AbortSignal): Promise<T> {
    if (this.#closed) return Promise.reject(new RolloutError('backend_error', 'embedded engine is closed'));
    if (signal.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    const slot = this.#free.shift();
    if (slot !== undefined) return Promise.resolve(slot);
    return new Promise<T>((resolve, reject) => {
      const waiter: Waiter<T> = {
        resolve,
        reject,
        signal,
        onAbort: () => {
          const at = this.#waiters.indexOf(waiter);
          if (at >= 0) this.#waiters.splice(at, 1);
          reject(RolloutError.from(signal.reason, 'cancelled'));
        },
      };
      signal.addEventListener('abort', waiter.onAbort, { once: true });
      this.#waiters.push(waiter);
    });
  }

  release(slot: T): void {
    const next = this.#waiters.shift();
    if (next === undefined) {
      this.#free.push(slot);
      return;
    }
    next.signal.removeEventListener('abort', next.onAbort);
    next.resolve(slot);
  }

  close(): void {
    this.#closed = true;
    for (const w of this.#waiters.splice(0)) {
      w.signal.removeEventListener('abort', w.onAbort);
      w.reject(new RolloutError('backend_error', 'embedded engine is closed'));
    }
  }
}
