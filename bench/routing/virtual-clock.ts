import { Heap } from 'heap-js';

interface Timer {
  readonly at: number;
  readonly seq: number;
  readonly fire: () => void;
  cancelled: boolean;
}

/** A scheduled callback that can be called off (an engine reschedules its next completion on every change). */
export interface TimerHandle {
  cancel(): void;
}

/**
 * Virtual time for a discrete-event simulation that drives real async code (the production BackendPool, its
 * leases and slot queues). Events fire in (time, scheduling order); after each one the clock waits for a
 * macrotask turn, so every promise continuation the event set off has run before time moves on. Nothing reads
 * the wall clock, so a run is deterministic and takes as long as its events, not as long as its virtual time.
 *
 * Invariant: `now` never decreases; code under simulation must not use real timers on its hot path (the pool
 * does not: its only timers are health probes, not started here, and acquire timeouts, armed only when no
 * backend is eligible, which never happens here).
 */
export class VirtualClock {
  #now = 0;
  #seq = 0;
  readonly #timers = new Heap<Timer>((a, b) => a.at - b.at || a.seq - b.seq);

  /** Virtual seconds since the start. */
  get now(): number {
    return this.#now;
  }

  /** Calls `fire` after `delay` virtual seconds (≥ 0). */
  after(delay: number, fire: () => void): TimerHandle {
    const timer: Timer = { at: this.#now + Math.max(0, delay), seq: this.#seq++, fire, cancelled: false };
    this.#timers.push(timer);
    return { cancel: () => (timer.cancelled = true) };
  }

  sleep(seconds: number): Promise<void> {
    return new Promise((resolve) => this.after(seconds, resolve));
  }

  /** Runs events until none is left and no continuation schedules another. */
  async run(): Promise<void> {
    for (;;) {
      await new Promise<void>((resolve) => setImmediate(resolve));
      let timer = this.#timers.pop();
      while (timer?.cancelled === true) timer = this.#timers.pop();
      if (timer === undefined) return;
      this.#now = timer.at;
      timer.fire();
    }
  }
}
