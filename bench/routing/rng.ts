import { seededRandom } from '../../src/testing/arithmetic.js';

/**
 * Seeded randomness for the routing simulation: the same seed gives the same workload on every machine, so runs
 * (and the vitest check of the simulator) are reproducible. mulberry32: tiny, fast, good enough for workloads.
 */
export class Rng {
  readonly #uniform: () => number;

  constructor(seed: number) {
    this.#uniform = seededRandom(seed);
  }

  /** Uniform in [0, 1). */
  next(): number {
    return this.#uniform();
  }

  /** Standard normal (Box–Muller). */
  normal(): number {
    const u = 1 - this.next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * this.next());
  }

  /**
   * Log-normal with the given median and shape, clamped to [min, max]: long-tailed like real turn counts and
   * token lengths (most short, a few very long), but bounded as budgets bound them.
   */
  logNormal(median: number, sigma: number, min: number, max: number): number {
    return Math.min(max, Math.max(min, median * Math.exp(sigma * this.normal())));
  }
}

/** FNV-1a, 32 bits: a stable string hash for consistent hashing (the same ring on every run). */
export function fnv1a(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}
