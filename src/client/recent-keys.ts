/**
 * A set of string keys that holds at most `cap`, forgetting the oldest added first: what a reconnecting session
 * remembers of the trajectories a stream delivered (RolloutSession), so a stream up for a week does not keep every key.
 */
export class RecentKeys implements Iterable<string> {
  private readonly keys = new Set<string>();

  constructor(readonly cap: number) {
    if (!Number.isInteger(cap) || cap < 1) throw new RangeError(`RecentKeys: the cap must be a positive integer, got ${String(cap)}`);
  }

  get size(): number {
    return this.keys.size;
  }

  has(key: string): boolean {
    return this.keys.has(key);
  }

  add(key: string): void {
    this.keys.add(key);
    // A Set iterates in insertion order: its first key is the oldest.
    if (this.keys.size > this.cap) this.keys.delete(this.keys.values().next().value!);
  }

  delete(key: string): void {
    this.keys.delete(key);
  }

  [Symbol.iterator](): Iterator<string> {
    return this.keys.values();
  }
}
