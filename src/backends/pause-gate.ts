import { RolloutError } from '../errors.js';

interface Held {
  resolve: () => void;
  reject: (err: unknown) => void;
  cleanup: () => void;
}

/**
 * Where a paused backend's new requests wait (PauseGeneration): closed, {@link pass} blocks until {@link open};
 * open, it passes at once. A held request is not failed, not failed over and not timed: it waits for as long as
 * the pause lasts, bounded only by its own signal (run timeout, cancellation) — or until the backend goes away
 * ({@link rejectAll}), when it moves to another backend like any request of a lost backend.
 */
export class PauseGate {
  #closed = false;
  #closedAt = 0;
  #closedMs = 0;
  readonly #held = new Set<Held>();

  get closed(): boolean {
    return this.#closed;
  }

  /** How long the gate has been closed, in all (ms): the backend's time paused (see GenerateRequest.pausedMs). */
  closedMs(): number {
    return this.#closedMs + (this.#closed ? performance.now() - this.#closedAt : 0);
  }

  /** Requests waiting for the gate to open. */
  get holding(): number {
    return this.#held.size;
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#closedAt = performance.now();
  }

  /** Opens the gate and lets every held request go, oldest first. */
  open(): void {
    if (this.#closed) this.#closedMs += performance.now() - this.#closedAt;
    this.#closed = false;
    for (const held of [...this.#held]) {
      this.#held.delete(held);
      held.cleanup();
      held.resolve();
    }
  }

  /** Resolves when the gate is open (at once if it is); rejects with the signal's reason if aborted first. */
  pass(signal: AbortSignal): Promise<void> {
    if (signal.aborted) return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
    if (!this.#closed) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const onAbort = (): void => {
        if (!this.#held.delete(held)) return;
        reject(RolloutError.from(signal.reason, 'cancelled'));
      };
      const held: Held = { resolve, reject, cleanup: () => signal.removeEventListener('abort', onAbort) };
      signal.addEventListener('abort', onAbort, { once: true });
      this.#held.add(held);
    });
  }

  /** Fails every held request with `err` (the backend was removed or went unhealthy); the gate stays as it is. */
  rejectAll(err: unknown): void {
    for (const held of [...this.#held]) {
      this.#held.delete(held);
      held.cleanup();
      held.reject(err);
    }
  }
}
