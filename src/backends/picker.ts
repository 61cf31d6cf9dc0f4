import { Heap } from 'heap-js';

/**
 * What the routing heap orders by: live load and the capacity it is weighed against. Every field must be a
 * non-negative integer (capacity ≥ 1) so that keys compare exactly, without floating-point ties.
 */
export interface LoadKey {
  readonly id: string;
  /** Requests the engine runs at once (its max concurrency): what the load is weighed against. */
  readonly capacity: number;
  readonly inflightTrajectories: number;
  /** Requests routed to the engine and not finished: running plus queued. */
  readonly inflightRequests: number;
}

/** Requests waiting for a slot: those beyond capacity (the pool's slot queue is FIFO and work-conserving). */
export function queuedRequests(k: LoadKey): number {
  return Math.max(0, k.inflightRequests - k.capacity);
}

/**
 * The weighted key as an exact fraction: the load the backend would carry with one more trajectory,
 * `(inflightTrajectories + queuedRequests + 1) / capacity`.
 *
 * Why this shape:
 * - Dividing by capacity makes an engine with 64 slots take four times the trajectories of one with 16, instead
 *   of the same number (a capacity-blind heap starves big engines and queues on small ones).
 * - Queued requests count a second time: a backend whose slots are all taken already makes its trajectories
 *   wait, so it should look fuller than its trajectory count says until the backlog clears.
 * - "+1" (the load after placing, as in D'Hondt apportionment) makes empty engines fill biggest first and keeps
 *   every engine within one trajectory of its proportional share when trajectories only arrive.
 */
export function weightedLoad(k: LoadKey): { readonly num: number; readonly den: number } {
  return { num: k.inflightTrajectories + queuedRequests(k) + 1, den: k.capacity };
}

/**
 * Orders backends by weighted load (see {@link weightedLoad}), then by requests per capacity (the live pressure
 * on its slots right now), then by id so that ties break the same way on every run. Fractions are compared by
 * cross-multiplication, so equal loads are exactly equal. Total and deterministic, so the property tests can
 * compare against a reference model.
 */
export function compareLoad(a: LoadKey, b: LoadKey): number {
  const ka = weightedLoad(a);
  const kb = weightedLoad(b);
  const primary = ka.num * kb.den - kb.num * ka.den;
  if (primary !== 0) return primary;
  const secondary = a.inflightRequests * b.capacity - b.inflightRequests * a.capacity;
  if (secondary !== 0) return secondary;
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

/**
 * The outcome of one pick, as a tagged union (grpc-js picker style) so callers must handle "nothing eligible"
 * explicitly instead of receiving `undefined`. `queue` means: wait for the pool to change, then pick again.
 */
export type PickResult<T> =
  | { readonly type: 'pick'; readonly backend: T }
  | { readonly type: 'queue'; readonly reason: 'no_backends' | 'none_eligible' };

/**
 * The routing heap: a heap-js min-heap of the backends that may take new trajectories (healthy, not draining,
 * not removed), keyed by weighted live load ({@link compareLoad}). The pool keeps one; bench/routing drives
 * another with simulated engines, so the benchmark measures this exact code.
 *
 * Invariant: a backend's key must not change while it sits in the heap — heap-js prunes its search by the
 * comparator, so an element whose key moved can no longer be found or removed. Every load change therefore
 * goes through `update`, which takes the backend out, applies the change, and puts it back if still eligible.
 */
export class LoadHeap<T extends LoadKey> {
  readonly #heap = new Heap<T>(compareLoad);
  readonly #members = new Set<T>();

  /** Applies `mutate` to the backend's counters and re-seats it according to `eligible` (evaluated after). */
  update(backend: T, eligible: (backend: T) => boolean, mutate?: (backend: T) => void): void {
    if (this.#members.has(backend)) {
      if (!this.#heap.remove(backend)) throw new Error(`load heap lost backend ${backend.id}`);
      this.#members.delete(backend);
    }
    mutate?.(backend);
    if (eligible(backend)) {
      this.#heap.push(backend);
      this.#members.add(backend);
    }
  }

  /** Takes the backend out for good (removed from the pool). */
  delete(backend: T): void {
    if (this.#members.delete(backend)) this.#heap.remove(backend);
  }

  has(backend: T): boolean {
    return this.#members.has(backend);
  }

  get size(): number {
    return this.#members.size;
  }

  /** The members from least to most loaded, without disturbing the heap (for tests and statistics). */
  ordered(): T[] {
    const copy = this.#heap.clone();
    const out: T[] = [];
    for (let next = copy.pop(); next !== undefined; next = copy.pop()) out.push(next);
    return out;
  }

  /**
   * The least-loaded eligible backend, without changing anything (the caller assigns the trajectory through
   * `update`). `total` is the pool's backend count, to tell "no backends at all" from "none eligible".
   */
  pick(total: number): PickResult<T> {
    const top = this.#heap.peek();
    if (top !== undefined) return { type: 'pick', backend: top };
    return { type: 'queue', reason: total === 0 ? 'no_backends' : 'none_eligible' };
  }
}
