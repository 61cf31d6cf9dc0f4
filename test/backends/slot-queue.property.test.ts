import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { SlotQueue } from '../../src/backends/backend-state.js';

/**
 * The per-backend slot queue as a data structure: random acquires (with priorities), aborts, releases and limit
 * changes checked after every step against a reference model that serves waiters by (priority desc, arrival asc)
 * whenever fewer than `limit` hold a slot.
 */

type Op =
  | { kind: 'acquire'; priority: number }
  | { kind: 'abort'; pick: number }
  | { kind: 'release'; pick: number }
  | { kind: 'resize'; limit: number };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  { arbitrary: fc.record({ kind: fc.constant('acquire' as const), priority: fc.integer({ min: 0, max: 3 }) }), weight: 5 },
  { arbitrary: fc.record({ kind: fc.constant('abort' as const), pick: fc.nat() }), weight: 1 },
  { arbitrary: fc.record({ kind: fc.constant('release' as const), pick: fc.nat() }), weight: 3 },
  { arbitrary: fc.record({ kind: fc.constant('resize' as const), limit: fc.integer({ min: 1, max: 4 }) }), weight: 1 },
);

interface Entry {
  readonly seq: number;
  readonly priority: number;
  readonly controller: AbortController;
  /** What the queue did with it (observed). */
  state: 'waiting' | 'held' | 'cancelled' | 'released';
  /** What the model says it must be. */
  expected: 'waiting' | 'held' | 'cancelled' | 'released';
}

const flush = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

async function run(initialLimit: number, ops: readonly Op[]): Promise<void> {
  const queue = new SlotQueue(initialLimit);
  let limit = initialLimit;
  const entries: Entry[] = [];
  const held = (): Entry[] => entries.filter((e) => e.expected === 'held');
  /** The model's grant rule: best waiting entry first while there is room. */
  const grant = (): void => {
    for (;;) {
      if (held().length >= limit) return;
      const next = entries.filter((e) => e.expected === 'waiting').sort((a, b) => b.priority - a.priority || a.seq - b.seq)[0];
      if (next === undefined) return;
      next.expected = 'held';
    }
  };

  for (const op of ops) {
    switch (op.kind) {
      case 'acquire': {
        const entry: Entry = { seq: entries.length, priority: op.priority, controller: new AbortController(), state: 'waiting', expected: 'waiting' };
        entries.push(entry);
        queue.acquire(entry.controller.signal, op.priority).then(
          () => (entry.state = 'held'),
          () => (entry.state = 'cancelled'),
        );
        // Immediate admission only when nobody waits (no barging past waiters, whatever the priority).
        if (held().length < limit && !entries.some((e) => e !== entry && e.expected === 'waiting')) entry.expected = 'held';
        break;
      }
      case 'abort': {
        const waiting = entries.filter((e) => e.expected === 'waiting');
        const entry = waiting[op.pick % Math.max(1, waiting.length)];
        if (entry === undefined) break;
        entry.controller.abort();
        entry.expected = 'cancelled';
        break;
      }
      case 'release': {
        const holding = held();
        const entry = holding[op.pick % Math.max(1, holding.length)];
        if (entry === undefined) break;
        queue.release();
        entry.expected = 'released';
        entry.state = 'released';
        grant();
        break;
      }
      case 'resize': {
        queue.resize(op.limit);
        limit = op.limit;
        grant();
        break;
      }
    }
    await flush();
    for (const e of entries) expect(e.state, `entry ${e.seq} (priority ${e.priority})`).toBe(e.expected);
    expect(queue.running).toBe(held().length);
    expect(queue.waiting).toBe(entries.filter((e) => e.expected === 'waiting').length);
    expect(queue.limit).toBe(limit);
  }
}

describe('SlotQueue', () => {
  it('serves waiters by priority then arrival, never holds more than its limit after a grant, and counts exactly', async () => {
    await fc.assert(
      fc.asyncProperty(fc.integer({ min: 1, max: 4 }), fc.array(opArb, { maxLength: 60 }), (limit, ops) => run(limit, ops)),
      { numRuns: 300 },
    );
  });

  it('is FIFO when every priority is the same', async () => {
    const queue = new SlotQueue(1);
    const order: number[] = [];
    const signal = new AbortController().signal;
    await queue.acquire(signal);
    const waits = [0, 1, 2, 3].map((i) => queue.acquire(signal).then(() => order.push(i)));
    for (let i = 0; i < 4; i++) {
      queue.release();
      await flush();
    }
    await Promise.all(waits);
    expect(order).toEqual([0, 1, 2, 3]);
  });

  it('admits waiters when the limit grows and none when it shrinks below what runs', async () => {
    const queue = new SlotQueue(1);
    const signal = new AbortController().signal;
    await queue.acquire(signal);
    let admitted = 0;
    for (let i = 0; i < 3; i++) void queue.acquire(signal).then(() => admitted++);
    queue.resize(3);
    await flush();
    expect(admitted).toBe(2);
    expect(queue.running).toBe(3);
    queue.resize(1);
    queue.release();
    queue.release();
    await flush();
    expect(admitted).toBe(2); // one still runs and the limit is one: the last waiter waits
    queue.release();
    await flush();
    expect(admitted).toBe(3);
  });
});
