import type { PauseMode } from '../backends/types.js';

/** How a simulated request ended: all its tokens, or aborted after `produced` of them. */
export interface InflightOutcome {
  produced: number;
  aborted: boolean;
}

interface Entry {
  readonly total: number;
  readonly latencyMs: number;
  /** Tokens decoded before the current run segment (a keep-pause freezes progress here). */
  done: number;
  startedAt: number;
  timer: NodeJS.Timeout | undefined;
  resolve: (outcome: InflightOutcome) => void;
}

/**
 * TEST DOUBLE: the in-flight requests of a fake engine, decoding at `latencyMs` per token, with the control
 * operations real engines expose for weight updates: abort by id or all (the request ends at once with the tokens
 * decoded so far), and pause in three modes — `abort` (abort all), `wait` (the pause returns once every running
 * request has finished), `keep` (running requests freeze and continue on resume). While paused, new requests wait
 * in {@link admit} until {@link resume}, as vLLM's and SGLang's do.
 */
export class FakeInflight {
  readonly #entries = new Map<string, Entry>();
  readonly #admitWaiters: Array<() => void> = [];
  readonly #idleWaiters: Array<() => void> = [];
  #paused = false;
  #aborted = 0;

  get paused(): boolean {
    return this.#paused;
  }

  get size(): number {
    return this.#entries.size;
  }

  /** Requests ended by an abort so far. */
  get abortedCount(): number {
    return this.#aborted;
  }

  /** Ids of the requests decoding now. */
  ids(): string[] {
    return [...this.#entries.keys()];
  }

  /** Resolves when the engine is not paused (at once when it is not). */
  async admit(): Promise<void> {
    while (this.#paused) await new Promise<void>((resolve) => this.#admitWaiters.push(resolve));
  }

  /** Decodes `total` tokens at `latencyMs` each under `id`; resolves when done or aborted. */
  run(id: string, total: number, latencyMs: number): Promise<InflightOutcome> {
    if (latencyMs <= 0 || total === 0 || this.#entries.has(id)) return Promise.resolve({ produced: total, aborted: false });
    return new Promise<InflightOutcome>((resolve) => {
      const entry: Entry = { total, latencyMs, done: 0, startedAt: Date.now(), timer: undefined, resolve };
      this.#entries.set(id, entry);
      this.#schedule(id, entry);
    });
  }

  /** The client went away: forget the request (nothing is answered). */
  cancel(id: string): void {
    const entry = this.#entries.get(id);
    if (entry === undefined) return;
    clearTimeout(entry.timer);
    this.#finish(id, entry, { produced: this.#progress(entry), aborted: true }, false);
  }

  /** Aborts the given requests (unknown ids are ignored) or all; returns how many were aborted. */
  abort(ids?: readonly string[]): number {
    let count = 0;
    for (const id of ids ?? this.ids()) {
      const entry = this.#entries.get(id);
      if (entry === undefined) continue;
      clearTimeout(entry.timer);
      this.#finish(id, entry, { produced: this.#progress(entry), aborted: true }, true);
      count++;
    }
    return count;
  }

  async pause(mode: PauseMode): Promise<void> {
    this.#paused = true;
    if (mode === 'abort') this.abort();
    else if (mode === 'keep') {
      for (const entry of this.#entries.values()) {
        entry.done = this.#progress(entry);
        clearTimeout(entry.timer);
        entry.timer = undefined;
      }
    } else {
      while (this.#entries.size > 0) await new Promise<void>((resolve) => this.#idleWaiters.push(resolve));
    }
  }

  resume(): void {
    if (!this.#paused) return;
    this.#paused = false;
    for (const [id, entry] of this.#entries) if (entry.timer === undefined) this.#schedule(id, entry);
    for (const wake of this.#admitWaiters.splice(0)) wake();
  }

  #schedule(id: string, entry: Entry): void {
    entry.startedAt = Date.now();
    entry.timer = setTimeout(() => this.#finish(id, entry, { produced: entry.total, aborted: false }, false), (entry.total - entry.done) * entry.latencyMs);
  }

  #progress(entry: Entry): number {
    if (entry.timer === undefined) return entry.done;
    return Math.min(entry.total, entry.done + Math.floor((Date.now() - entry.startedAt) / entry.latencyMs));
  }

  #finish(id: string, entry: Entry, outcome: InflightOutcome, countAbort: boolean): void {
    this.#entries.delete(id);
    if (countAbort) this.#aborted++;
    entry.resolve(outcome);
    if (this.#entries.size === 0) for (const wake of this.#idleWaiters.splice(0)) wake();
  }
}
