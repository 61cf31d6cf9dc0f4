/**
 * One engine's prefix cache, as the simulation models it: an LRU of trajectory prefixes measured in tokens.
 * A trajectory's entry holds the KV of its whole context after the turn it last ran here; the next turn reuses
 * it only when it comes back to this engine before the entry is evicted (vLLM's automatic prefix caching behaves
 * so for a growing conversation). Invariant: the tokens held never exceed `capacityTokens` after an insert.
 */
export class PrefixCache {
  /** Insertion order is recency order: the first key is the least recently used. */
  readonly #entries = new Map<number, number>();
  #tokens = 0;

  constructor(readonly capacityTokens: number) {}

  get tokens(): number {
    return this.#tokens;
  }

  /** Cached prefix tokens of the trajectory (0 when absent), marking it recently used. */
  lookup(trajectory: number): number {
    const tokens = this.#entries.get(trajectory);
    if (tokens === undefined) return 0;
    this.#entries.delete(trajectory);
    this.#entries.set(trajectory, tokens);
    return tokens;
  }

  /** Records the trajectory's context as cached, evicting least recently used prefixes to make room. */
  insert(trajectory: number, tokens: number): void {
    this.drop(trajectory);
    if (tokens > this.capacityTokens) return;
    this.#entries.set(trajectory, tokens);
    this.#tokens += tokens;
    for (const [victim, size] of this.#entries) {
      if (this.#tokens <= this.capacityTokens) break;
      this.#entries.delete(victim);
      this.#tokens -= size;
    }
  }

  /** Forgets the trajectory (it ended, or its next turn ran elsewhere). */
  drop(trajectory: number): void {
    const tokens = this.#entries.get(trajectory);
    if (tokens === undefined) return;
    this.#entries.delete(trajectory);
    this.#tokens -= tokens;
  }
}
