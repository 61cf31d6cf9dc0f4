import { toNumberArray } from './token-column.js';

/** The typed arrays a lazily kept number field can hold (a ledger's columns: ids, mask, logprobs). */
export type NumberView = Int32Array | Uint8Array | Float64Array;

/** Lazily kept number fields, by object then field name (see {@link setLazyNumbers}). */
const views = new WeakMap<object, Map<string, NumberView>>();

/**
 * Sets `target[key]` to `values`: as is for a number[], and for a typed array as an accessor that makes the number[]
 * on its first read and then is a plain data property holding it (as pipeline/lazy-prompt.ts does for a trajectory's prompt ids).
 *
 * Why: a finished trajectory's response ids, mask and logprobs are read by the server only to encode them, which
 * {@link numbersOf} does from the ledger's own columns; made as number[]s (the generated Trajectory's type) they were
 * ~150-220 KB of heap per 64K-token trajectory, surviving into the old generation (BENCH_HEAP_SAMPLE on the 64K pass:
 * the largest item), whose growth sets off the main isolate's mark-compacts. Readers of the field still get a
 * number[]; spreads and JSON read it, so they make it too.
 */
export function setLazyNumbers<T extends object>(target: T, key: keyof T & string, values: ArrayLike<number>): void {
  if (Array.isArray(values)) {
    (target as Record<string, unknown>)[key] = values;
    return;
  }
  const view = values as NumberView; // not an array: a ledger column's typed view
  let fields = views.get(target);
  if (fields === undefined) views.set(target, (fields = new Map()));
  fields.set(key, view);
  const settle = (value: number[]): number[] => {
    fields.delete(key);
    Object.defineProperty(target, key, { value, writable: true, enumerable: true, configurable: true });
    return value;
  };
  Object.defineProperty(target, key, {
    enumerable: true,
    configurable: true,
    get: () => settle(toNumberArray(view)),
    set: (value: number[]) => void settle(value),
  });
}

/** `target[key]` without making a number[] of a lazily kept field (see {@link setLazyNumbers}). */
export function numbersOf<T extends object>(target: T, key: keyof T & string): ArrayLike<number> {
  return views.get(target)?.get(key) ?? (target[key] as ArrayLike<number>);
}

/** Whether `target[key]` is still the typed array it was set to (no number[] made yet; for tests). */
export function numbersPending<T extends object>(target: T, key: keyof T & string): boolean {
  return views.get(target)?.has(key) ?? false;
}
