/** The typed arrays a {@link TokenColumn} can hold: ids (Int32Array), mask (Uint8Array), logprobs (Float64Array). */
type Storage = Int32Array | Uint8Array | Float64Array;

/**
 * An append-only column of numbers in a typed array that doubles when full: a ledger's context ids, response mask
 * or logprobs while its trajectory runs.
 *
 * Why not a number[]: a long trajectory's columns live as long as it runs (seconds, many young-generation
 * collections) and a JS array's elements are on the V8 heap, so every scavenge copied them — tens of kilobytes per
 * column per trajectory, then again when promoted; with 64K-token conversations those copies were most of the
 * pauses that made the event loop late. A typed array's elements are off the V8 heap: a collection moves only its
 * small header. Values are stored exactly: ids are checked non-negative int32 before they are appended, the mask
 * is 0 or 1, and logprobs are doubles as the engine returned them.
 */
export class TokenColumn<S extends Storage> {
  #data: S;
  #length = 0;
  readonly #make: (capacity: number) => S;

  constructor(make: (capacity: number) => S, capacity = 256) {
    this.#make = make;
    this.#data = make(capacity);
  }

  get length(): number {
    return this.#length;
  }

  /** Appends `count` copies of `value`. */
  fill(value: number, count: number): void {
    this.#grow(this.#length + count);
    this.#data.fill(value, this.#length, this.#length + count);
    this.#length += count;
  }

  /** Appends every value of `values` (a typed array is copied in one `set`). */
  append(values: readonly number[] | Int32Array): void {
    this.#grow(this.#length + values.length);
    const data = this.#data;
    if (!Array.isArray(values)) {
      data.set(values as Int32Array, this.#length);
      this.#length += values.length;
      return;
    }
    let at = this.#length;
    for (let i = 0; i < values.length; i++) data[at++] = values[i]!;
    this.#length = at;
  }

  /**
   * The values so far, as a view of the column's storage (no copy). Values are only ever appended, so what the view
   * shows never changes; it must not be written to.
   */
  view(): S {
    return this.#data.subarray(0, this.#length) as S;
  }

  /** The values in [start, end) as a new number[] (the caller's to keep). */
  toArray(start = 0, end = this.#length): number[] {
    return toNumberArray(this.#data, start, end);
  }

  #grow(needed: number): void {
    if (needed <= this.#data.length) return;
    const bigger = this.#make(Math.max(needed, 2 * this.#data.length));
    bigger.set(this.#data.subarray(0, this.#length) as never);
    this.#data = bigger;
  }
}

/**
 * The values of a typed array in [start, end) as a new number[]: a plain loop into a preallocated array (Array.from
 * over a typed array is several times slower).
 */
export function toNumberArray(values: Storage, start = 0, end = values.length): number[] {
  const out = new Array<number>(Math.max(0, end - start));
  for (let i = start; i < end; i++) out[i - start] = values[i]!;
  return out;
}

export const idColumn = (capacity?: number): TokenColumn<Int32Array> => new TokenColumn((n) => new Int32Array(n), capacity);
export const maskColumn = (): TokenColumn<Uint8Array> => new TokenColumn((n) => new Uint8Array(n));
export const logprobColumn = (): TokenColumn<Float64Array> => new TokenColumn((n) => new Float64Array(n));
