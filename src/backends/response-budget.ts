import { RolloutError } from '../errors.js';

/** Default of {@link ResponseBudget}: 1 GiB of engine answers buffered at once across every engine of a pool. */
export const DEFAULT_MAX_BUFFERED_RESPONSE_BYTES = 1 << 30;
/** Bounds of the budget (config `backendMaxBufferedResponseBytes`): at least 1 MiB, at most 64 GiB. */
export const MIN_BUFFERED_RESPONSE_BYTES = 1 << 20;
export const MAX_BUFFERED_RESPONSE_BYTES = 64 * 2 ** 30;

/** A reservation waiting for room; `cancel` takes it out of the queue (its request ended first). */
export interface BudgetTicket {
  cancel(): void;
}

interface Waiter {
  readonly bytes: number;
  readonly grant: () => void;
  done: boolean;
}

/**
 * The bytes of engine answers buffered at once, across every request that shares it (the pool's engines). The
 * per-request cap (maxResponseBytes) bounds one answer; with 1,024 concurrent requests each allowed 16 MiB that is
 * still 16 GiB of buffers. Each answer reserves its size before its body is read — its declared content-length, or
 * its whole cap when the engine sends none — and gives it back when it settles.
 *
 * When there is no room the answer waits (its reading paused: the engine's bytes stay in the socket, under TCP flow
 * control) rather than failing: the trainer's run goes on, only slower. The wait counts against the request's own
 * budget (requestTimeoutMs) and ends with its cancellation, like any other part of the exchange. It cannot deadlock: a granted reservation
 * covers its whole answer, so every holder finishes (or times out, or is cancelled) and frees its room without
 * waiting for anything else; waiters are served in arrival order, so a large answer is not starved by small ones.
 * An answer larger than the whole budget could never fit and fails at once (see {@link tooLargeForBudget}).
 *
 * Invariant: `heldBytes <= maxBytes`, and it returns to 0 when every answer has settled.
 */
export class ResponseBudget {
  #held = 0;
  readonly #queue: Waiter[] = [];

  constructor(readonly maxBytes: number) {
    if (!Number.isSafeInteger(maxBytes) || maxBytes < 1) {
      throw RolloutError.invalid('maxBufferedResponseBytes', `must be a positive integer number of bytes, got ${maxBytes}`);
    }
  }

  /** Bytes reserved by answers being read now. */
  get heldBytes(): number {
    return this.#held;
  }

  /** Answers waiting for room. */
  get waiting(): number {
    return this.#queue.length;
  }

  /**
   * Reserves `bytes` (at most {@link maxBytes}): true when granted at once; otherwise false, and `grant` is called
   * once room is made — unless the returned ticket's `cancel` came first. Whoever was granted must {@link release}
   * the same number of bytes.
   */
  reserve(bytes: number, grant: () => void): { granted: true } | { granted: false; ticket: BudgetTicket } {
    if (bytes > this.maxBytes) throw new RangeError(`a reservation of ${bytes} bytes can never fit a ${this.maxBytes}-byte budget`);
    if (this.#queue.length === 0 && this.#held + bytes <= this.maxBytes) {
      this.#held += bytes;
      return { granted: true };
    }
    const waiter: Waiter = { bytes, grant, done: false };
    this.#queue.push(waiter);
    return {
      granted: false,
      ticket: {
        cancel: () => {
          if (waiter.done) return;
          waiter.done = true;
          this.#queue.splice(this.#queue.indexOf(waiter), 1);
          // The head may have been the one blocking smaller answers behind it.
          this.#grant();
        },
      },
    };
  }

  release(bytes: number): void {
    this.#held -= bytes;
    this.#grant();
  }

  #grant(): void {
    for (let head = this.#queue[0]; head !== undefined && this.#held + head.bytes <= this.maxBytes; head = this.#queue[0]) {
      this.#queue.shift();
      head.done = true;
      this.#held += head.bytes;
      head.grant();
    }
  }
}

/** The backend_error of an answer that cannot fit the budget even alone. */
export function tooLargeForBudget(engine: string, what: string, budget: ResponseBudget, seen: string): RolloutError {
  return new RolloutError(
    'backend_error',
    `${engine} sent a ${what} answer larger than the ${budget.maxBytes}-byte budget of engine answers buffered at once (${seen}); ` +
      'raise backendMaxBufferedResponseBytes or lower max_tokens',
  );
}
