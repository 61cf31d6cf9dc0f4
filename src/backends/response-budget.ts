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
  readonly holder: Holder | undefined;
  readonly grant: () => void;
  done: boolean;
}

/** One engine's part of the budget: the bytes its answers hold and its requests in flight. */
interface Holder {
  held: number;
  active: number;
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
 * Fairness between engines: requests name their engine (`holder`, see {@link enter}), and one engine's answers hold at
 * most its share of the budget — `maxBytes` over the engines with requests in flight — unless it holds nothing (an
 * answer larger than the share still goes, alone; what was granted is never taken back, so an engine that took more
 * while it was alone keeps it until those answers end, and gets no more meanwhile). A stalled engine (headers sent, then a trickle or nothing, each
 * answer reserving its whole cap until the request times out) so keeps at most its share, and the other engines'
 * answers are read meanwhile; an answer waiting only for its own engine's share lets those behind it pass. An engine
 * alone (the others idle) may use the whole budget.
 *
 * Invariant: `heldBytes <= maxBytes`, and it returns to 0 when every answer has settled.
 */
export class ResponseBudget {
  #held = 0;
  readonly #queue: Waiter[] = [];
  /** The engines with requests in flight (see {@link enter}). */
  readonly #holders = new Map<object, Holder>();

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

  /** The most one engine's answers may grow to now: `maxBytes` over the engines with requests in flight (at least one). */
  get shareBytes(): number {
    return Math.floor(this.maxBytes / Math.max(1, this.#holders.size));
  }

  /**
   * A request of engine `key` (any object naming it: its HTTP client) is in flight: its answers count against that
   * engine's share from now on, and the engine counts among those sharing the budget until as many {@link leave}s.
   */
  enter(key: object): void {
    const holder = this.#holders.get(key);
    if (holder !== undefined) {
      holder.active++;
      return;
    }
    this.#holders.set(key, { held: 0, active: 1 });
    // One engine more: the others' shares shrank, so a waiter that was within its share and blocked those behind it
    // (arrival order) may now be over it and passed over, letting them go.
    this.#grant();
  }

  /** A request {@link enter}ed ended, after its reservation (if any) was released. */
  leave(key: object): void {
    const holder = this.#holders.get(key);
    if (holder === undefined) return;
    holder.active--;
    if (holder.active <= 0 && holder.held <= 0) this.#holders.delete(key);
    // One engine fewer: the others' shares grew.
    this.#grant();
  }

  /**
   * Reserves `bytes` (at most {@link maxBytes}) for an answer of engine `key` (one {@link enter}ed; none: no share
   * applies): true when granted at once; otherwise false, and `grant` is called once room is made — unless the
   * returned ticket's `cancel` came first. Whoever was granted must {@link release} the same bytes with the same key.
   */
  reserve(bytes: number, grant: () => void, key?: object): { granted: true } | { granted: false; ticket: BudgetTicket } {
    if (bytes > this.maxBytes) throw new RangeError(`a reservation of ${bytes} bytes can never fit a ${this.maxBytes}-byte budget`);
    const holder = key === undefined ? undefined : this.#holders.get(key);
    // Granted now unless an answer ahead waits for room (it goes first); those waiting for their own engine's share
    // are passed over, as #grant does (every waiter left in the queue waits for one or the other). No object is made
    // for an answer granted at once (one per engine answer).
    if (this.#fitsTotal(bytes) && this.#fitsShare(bytes, holder) && this.#queue.every((w) => !this.#fitsShare(w.bytes, w.holder))) {
      this.#take(bytes, holder);
      return { granted: true };
    }
    const waiter: Waiter = { bytes, holder, grant, done: false };
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

  release(bytes: number, key?: object): void {
    this.#held -= bytes;
    const holder = key === undefined ? undefined : this.#holders.get(key);
    if (holder !== undefined) {
      holder.held -= bytes;
      if (holder.active <= 0 && holder.held <= 0) this.#holders.delete(key!);
    }
    this.#grant();
  }

  #fitsTotal(bytes: number): boolean {
    return this.#held + bytes <= this.maxBytes;
  }

  /** Within its engine's share, or its engine holds nothing (an answer larger than the share still goes, alone). */
  #fitsShare(bytes: number, holder: Holder | undefined): boolean {
    return holder === undefined || holder.held <= 0 || holder.held + bytes <= this.shareBytes;
  }

  #take(bytes: number, holder: Holder | undefined): void {
    this.#held += bytes;
    if (holder !== undefined) holder.held += bytes;
  }

  /**
   * Grants waiters in arrival order: one over its own engine's share is passed over (it waits for that engine's
   * answers, not for room); one within it that does not fit the room left stops the walk (so a large answer is not
   * starved by smaller ones behind it).
   */
  #grant(): void {
    for (let i = 0; i < this.#queue.length; ) {
      const w = this.#queue[i]!;
      if (!this.#fitsShare(w.bytes, w.holder)) {
        i++;
        continue;
      }
      if (!this.#fitsTotal(w.bytes)) return;
      this.#queue.splice(i, 1);
      w.done = true;
      this.#take(w.bytes, w.holder);
      w.grant();
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
