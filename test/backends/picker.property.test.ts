import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { compareLoad, LoadHeap } from '../../src/backends/picker.js';
import { referenceOrder } from './reference-load-order.js';

/**
 * The routing heap on its own, as a data structure: random updates checked against a linear scan after every
 * step, and the proportional share it gives heterogeneous engines under steady load. (The pool-level properties —
 * stickiness, failover, counters — are in pool.property.test.ts.)
 */

interface Key {
  id: string;
  capacity: number;
  inflightTrajectories: number;
  inflightRequests: number;
  eligible: boolean;
}

const eligible = (k: Key): boolean => k.eligible;

type Op =
  | { kind: 'trajectories' | 'requests'; pick: number; delta: number }
  | { kind: 'eligible'; pick: number; value: boolean }
  | { kind: 'delete'; pick: number };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ kind: fc.constantFrom('trajectories' as const, 'requests' as const), pick: fc.nat(), delta: fc.integer({ min: -3, max: 3 }) }),
  fc.record({ kind: fc.constant('eligible' as const), pick: fc.nat(), value: fc.boolean() }),
  fc.record({ kind: fc.constant('delete' as const), pick: fc.nat() }),
);
const capacitiesArb = fc.array(fc.integer({ min: 1, max: 64 }), { minLength: 1, maxLength: 8 });

describe('LoadHeap', () => {
  it('keeps heap order and membership after arbitrary updates, and picks the least weighted load', () => {
    fc.assert(
      fc.property(capacitiesArb, fc.array(opArb, { maxLength: 120 }), (capacities, ops) => {
        const heap = new LoadHeap<Key>();
        const keys: Key[] = capacities.map((capacity, i) => ({ id: `e${i}`, capacity, inflightTrajectories: 0, inflightRequests: 0, eligible: true }));
        const deleted = new Set<Key>();
        for (const k of keys) heap.update(k, eligible);
        for (const op of ops) {
          const k = keys[op.pick % keys.length]!;
          if (op.kind === 'delete') {
            heap.delete(k);
            deleted.add(k);
          } else if (deleted.has(k)) {
            continue;
          } else if (op.kind === 'eligible') {
            heap.update(k, eligible, (x) => (x.eligible = op.value));
          } else {
            const field = op.kind === 'trajectories' ? 'inflightTrajectories' : 'inflightRequests';
            heap.update(k, eligible, (x) => (x[field] = Math.max(0, x[field] + op.delta)));
          }
          const members = keys.filter((x) => x.eligible && !deleted.has(x));
          const ordered = heap.ordered();
          expect(new Set(ordered)).toEqual(new Set(members));
          expect(heap.size).toBe(members.length);
          const reference = referenceOrder(members);
          ordered.forEach((x, i) => expect(compareLoad(x, reference[i]!), `position ${i}`).toBe(0));
          const picked = heap.pick(keys.length - deleted.size);
          if (members.length === 0) expect(picked.type).toBe('queue');
          else expect(picked).toEqual({ type: 'pick', backend: reference[0] });
        }
      }),
      { numRuns: 300 },
    );
  });

  it('shares trajectories in proportion to capacity under steady load, within one trajectory per engine', () => {
    // A closed system: `total` trajectories in flight, each release followed by a new placement, the released
    // trajectory chosen adversarially by fast-check. With placement on the least (T + 1) / C, every engine stays
    // at most (total + engines - 1) / ΣC per unit of capacity, hence within `engines` of its exact share.
    fc.assert(
      fc.property(capacitiesArb, fc.integer({ min: 1, max: 400 }), fc.array(fc.nat(), { maxLength: 300 }), (capacities, total, releases) => {
        const heap = new LoadHeap<Key>();
        const keys: Key[] = capacities.map((capacity, i) => ({ id: `e${i}`, capacity, inflightTrajectories: 0, inflightRequests: 0, eligible: true }));
        for (const k of keys) heap.update(k, eligible);
        const place = (): void => {
          const picked = heap.pick(keys.length);
          if (picked.type !== 'pick') throw new Error('no pick');
          heap.update(picked.backend, eligible, (x) => x.inflightTrajectories++);
        };
        for (let i = 0; i < total; i++) place();
        const sumC = capacities.reduce((a, b) => a + b, 0);
        const check = (): void => {
          for (const k of keys) {
            expect(k.inflightTrajectories * sumC).toBeLessThanOrEqual((total + keys.length - 1) * k.capacity);
            expect(Math.abs(k.inflightTrajectories - (total * k.capacity) / sumC)).toBeLessThanOrEqual(keys.length);
          }
        };
        check();
        for (const r of releases) {
          const busy = keys.filter((k) => k.inflightTrajectories > 0);
          heap.update(busy[r % busy.length]!, eligible, (x) => x.inflightTrajectories--);
          place();
          check();
        }
      }),
      { numRuns: 300 },
    );
  });

  it('gives a 64-slot engine four times the trajectories of a 16-slot one', () => {
    const heap = new LoadHeap<Key>();
    const big: Key = { id: 'big', capacity: 64, inflightTrajectories: 0, inflightRequests: 0, eligible: true };
    const small: Key = { id: 'small', capacity: 16, inflightTrajectories: 0, inflightRequests: 0, eligible: true };
    heap.update(small, eligible);
    heap.update(big, eligible);
    const first: string[] = [];
    for (let i = 0; i < 160; i++) {
      const picked = heap.pick(2);
      if (picked.type !== 'pick') throw new Error('no pick');
      if (i < 5) first.push(picked.backend.id);
      heap.update(picked.backend, eligible, (x) => x.inflightTrajectories++);
    }
    expect(first).toEqual(['big', 'big', 'big', 'big', 'small']);
    expect([big.inflightTrajectories, small.inflightTrajectories]).toEqual([128, 32]);
  });

  it('counts queued requests as load: a backlogged engine loses new trajectories to an idle one', () => {
    const heap = new LoadHeap<Key>();
    const a: Key = { id: 'a', capacity: 4, inflightTrajectories: 4, inflightRequests: 4, eligible: true };
    const b: Key = { id: 'b', capacity: 4, inflightTrajectories: 5, inflightRequests: 0, eligible: true };
    heap.update(a, eligible);
    heap.update(b, eligible);
    expect(heap.pick(2)).toMatchObject({ backend: { id: 'a' } });
    heap.update(a, eligible, (x) => (x.inflightRequests = 6)); // two waiting for a slot
    expect(heap.pick(2)).toMatchObject({ backend: { id: 'b' } });
  });
});
