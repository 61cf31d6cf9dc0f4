import { Heap } from 'heap-js';

/** What the routing heap orders by: live load, then id so that ties break the same way on every run. */
export interface LoadKey {
  readonly id: string;
  readonly inflightTrajectories: number;
  readonly inflightRequests: number;
}

/**
 * Orders backends by live load: fewest in-flight trajectories first (a trajectory is a long, sticky stream of
 * requests, so it is the unit that fills an engine's KV cache), then fewest in-flight requests, then id.
 * Total and deterministic, so the property tests can compare against a reference model.
 */
export function compareLoad(a: LoadKey, b: LoadKey): number {
  if (a.inflightTrajectories !== b.inflightTrajectories) return a.inflightTrajectories - b.inflightTrajectories;
  if (a.inflightRequests !== b.inflightRequests) return a.inflightRequests - b.inflightRequests;
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
 * The pool's routing heap: a heap-js min-heap of the backends that may take new trajectories (healthy, not
 * draining, not removed), keyed by live load.
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
