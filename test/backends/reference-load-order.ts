import type { LoadKey } from '../../src/backends/picker.js';

/**
 * The routing key written out independently of `compareLoad`: (trajectories + queued + 1) / capacity, then
 * requests / capacity, then id. Floating point is exact enough here: equal fractions of small integers divide to
 * the same double and distinct ones never collide.
 */
export function referenceOrder<K extends LoadKey>(keys: readonly K[]): K[] {
  const weighted = (k: LoadKey): number => (k.inflightTrajectories + Math.max(0, k.inflightRequests - k.capacity) + 1) / k.capacity;
  return [...keys].sort((x, y) =>
    weighted(x) - weighted(y) || x.inflightRequests / x.capacity - y.inflightRequests / y.capacity || (x.id < y.id ? -1 : x.id > y.id ? 1 : 0));
}
