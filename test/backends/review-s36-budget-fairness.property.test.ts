import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ResponseBudget } from '../../src/backends/response-budget.js';

/**
 * ResponseBudget with engines (holders) as a data structure: random requests of three engines — each enters, reserves
 * an answer, is granted at once or later, releases (or is cancelled while waiting) and leaves, as EngineHttp's exchanges
 * do — checked after every step: the total never passes the budget; an engine holding several answers holds at most the
 * share it had when the last one was granted (so at most the budget over the engines in flight, one answer alone
 * excepted); a waiter that could go now is never left waiting (no lost wake-up); and once every request has ended
 * nothing is held or waiting.
 */

type Op =
  | { kind: 'start'; engine: number; bytes: number }
  | { kind: 'finish'; pick: number }
  | { kind: 'cancel'; pick: number };

const MAX = 100;
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { arbitrary: fc.record({ kind: fc.constant('start' as const), engine: fc.integer({ min: 0, max: 2 }), bytes: fc.integer({ min: 1, max: MAX }) }), weight: 5 },
  { arbitrary: fc.record({ kind: fc.constant('finish' as const), pick: fc.nat() }), weight: 3 },
  { arbitrary: fc.record({ kind: fc.constant('cancel' as const), pick: fc.nat() }), weight: 1 },
);

interface Request {
  readonly engine: object;
  readonly bytes: number;
  state: 'waiting' | 'held';
  cancel?: () => void;
}

describe('ResponseBudget shared by engines (property)', () => {
  it('never passes the budget or an engine\u2019s share, never strands a waiter that fits, and empties when every request ends', () => {
    fc.assert(
      fc.property(fc.array(opArb, { minLength: 1, maxLength: 80 }), (ops) => {
        const budget = new ResponseBudget(MAX);
        const engines = [{}, {}, {}];
        const live: Request[] = [];
        const end = (r: Request): void => {
          if (r.state === 'held') budget.release(r.bytes, r.engine);
          else r.cancel?.();
          live.splice(live.indexOf(r), 1);
          budget.leave(r.engine);
        };
        for (const op of ops) {
          if (op.kind === 'start') {
            const engine = engines[op.engine]!;
            budget.enter(engine);
            const r: Request = { engine, bytes: op.bytes, state: 'waiting' };
            live.push(r);
            const share = budget.shareBytes;
            const heldBefore = live.filter((x) => x.engine === engine && x.state === 'held').reduce((n, x) => n + x.bytes, 0);
            const result = budget.reserve(op.bytes, () => (r.state = 'held'), engine);
            if (result.granted) {
              r.state = 'held';
              // Granted at once: within the share, or the engine held nothing.
              expect(heldBefore === 0 || heldBefore + op.bytes <= share).toBe(true);
            } else {
              r.cancel = () => result.ticket.cancel();
            }
          } else if (live.length > 0) {
            const r = live[op.pick % live.length]!;
            if (op.kind === 'finish' && r.state === 'held') end(r);
            if (op.kind === 'cancel' && r.state === 'waiting') end(r);
          }
          const held = live.filter((x) => x.state === 'held').reduce((n, x) => n + x.bytes, 0);
          expect(budget.heldBytes).toBe(held);
          expect(held).toBeLessThanOrEqual(MAX);
          expect(budget.waiting).toBe(live.filter((x) => x.state === 'waiting').length);
          // No lost wake-up: a waiting answer whose engine holds nothing, with room for it, is not left waiting
          // unless an earlier waiter within its share waits for room (arrival order).
          const waiting = live.filter((x) => x.state === 'waiting');
          const heldBy = (e: object): number => live.filter((x) => x.engine === e && x.state === 'held').reduce((n, x) => n + x.bytes, 0);
          const first = waiting.find((x) => heldBy(x.engine) === 0 || heldBy(x.engine) + x.bytes <= budget.shareBytes);
          if (first !== undefined) expect(held + first.bytes).toBeGreaterThan(MAX);
        }
        // Every request ends: the held ones release, the waiting ones are granted in turn and then release.
        while (live.length > 0) {
          const r = live.find((x) => x.state === 'held') ?? live[0]!;
          end(r);
        }
        expect(budget.heldBytes).toBe(0);
        expect(budget.waiting).toBe(0);
        expect(budget.shareBytes).toBe(MAX);
      }),
      {
        numRuns: 300,
        examples: [
          // CI (stop 39, seed -315902313): engine 0's first request shrank the share to 33; engine 2's 15-byte answer
          // (23 held) was then over it and passed over, but its 1-byte answer behind it, within the share and with
          // room, stayed waiting until the next release (enter did not walk the queue).
          [
            [
              { kind: 'start', engine: 1, bytes: 63 },
              { kind: 'start', engine: 2, bytes: 23 },
              { kind: 'start', engine: 2, bytes: 15 },
              { kind: 'start', engine: 2, bytes: 1 },
              { kind: 'start', engine: 0, bytes: 1 },
              { kind: 'finish', pick: 0 },
            ],
          ],
        ],
      },
    );
  });
});
