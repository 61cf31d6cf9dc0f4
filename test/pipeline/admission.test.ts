import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { Admission } from '../../src/pipeline/admission.js';

/** Lets settled admissions run their `.then` callbacks. */
const flush = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** Records the order in which requests are admitted (or rejected). */
function tracker() {
  const events: string[] = [];
  const admit = (admission: Admission, name: string, n: number, signal?: AbortSignal): Promise<void> =>
    admission.admit(n, signal).then(
      () => void events.push(`+${name}`),
      (err: unknown) => void events.push(`!${name}:${err instanceof Error ? err.message : String(err)}`),
    );
  return { events, admit };
}

describe('Admission', () => {
  it('admits up to capacity at once and makes the rest wait until samples are released', async () => {
    const admission = new Admission(4);
    const { events, admit } = tracker();
    void admit(admission, 'a', 2);
    void admit(admission, 'b', 2);
    void admit(admission, 'c', 1);
    await flush();
    expect(events).toEqual(['+a', '+b']);
    expect(admission.inFlight).toBe(4);
    expect(admission.waiting).toBe(1);
    admission.release(1);
    await flush();
    expect(events).toEqual(['+a', '+b', '+c']);
    expect(admission.inFlight).toBe(4);
    expect(admission.waiting).toBe(0);
  });

  it('serves waiters first in, first out: a small request does not overtake a large one at the head', async () => {
    const admission = new Admission(4);
    const { events, admit } = tracker();
    await admit(admission, 'full', 4);
    void admit(admission, 'big', 3);
    void admit(admission, 'small', 1);
    await flush();
    admission.release(1); // 1 free: would fit `small`, but `big` is first in line
    await flush();
    expect(events).toEqual(['+full']);
    admission.release(2); // 3 free: `big` goes in, then nothing is left for `small`
    await flush();
    expect(events).toEqual(['+full', '+big']);
    admission.release(1);
    await flush();
    expect(events).toEqual(['+full', '+big', '+small']);
  });

  it('a newcomer that would fit still queues behind an earlier waiter (no barging)', async () => {
    const admission = new Admission(4);
    const { events, admit } = tracker();
    await admit(admission, 'held', 3);
    void admit(admission, 'waiter', 2); // 3 + 2 > 4: waits
    void admit(admission, 'newcomer', 1); // 3 + 1 <= 4, but someone is already in line
    await flush();
    expect(events).toEqual(['+held']);
    expect(admission.waiting).toBe(2);
    admission.release(3);
    await flush();
    expect(events).toEqual(['+held', '+waiter', '+newcomer']);
  });

  it('an aborted waiter leaves the line with the signal reason and lets the next one in', async () => {
    const admission = new Admission(2);
    const { events, admit } = tracker();
    await admit(admission, 'held', 2);
    const controller = new AbortController();
    const aborted = admit(admission, 'aborted', 2, controller.signal);
    void admit(admission, 'next', 1);
    await flush();
    expect(admission.waiting).toBe(2);
    controller.abort(new Error('client went away'));
    await aborted;
    expect(events).toEqual(['+held', '!aborted:client went away']);
    expect(admission.waiting).toBe(1);
    admission.release(1);
    await flush();
    expect(events).toEqual(['+held', '!aborted:client went away', '+next']);
    expect(admission.inFlight).toBe(2);
    controller.abort(); // a second abort after leaving is harmless
    expect(admission.inFlight).toBe(2);
  });

  it('aborting the head waiter admits the waiters behind it that now fit', async () => {
    const admission = new Admission(4);
    const { events, admit } = tracker();
    await admit(admission, 'held', 3);
    const controller = new AbortController();
    void admit(admission, 'head', 4, controller.signal);
    void admit(admission, 'behind', 1);
    await flush();
    expect(events).toEqual(['+held']);
    controller.abort(new Error('gone'));
    await flush();
    expect(events).toEqual(['+held', '!head:gone', '+behind']);
  });

  it('rejects at once when the signal is already aborted, instead of waiting for capacity forever', async () => {
    const admission = new Admission(1);
    const { events, admit } = tracker();
    await admit(admission, 'held', 1);
    const controller = new AbortController();
    controller.abort(new Error('already gone'));
    void admit(admission, 'pre-aborted', 1, controller.signal);
    await flush();
    expect(events).toEqual(['+held', '!pre-aborted:already gone']);
    expect(admission.waiting).toBe(0);
  });

  it('admits a request larger than capacity alone, once everything else has left', async () => {
    const admission = new Admission(4);
    const { events, admit } = tracker();
    await admit(admission, 'a', 1);
    void admit(admission, 'huge', 10);
    void admit(admission, 'after', 1);
    await flush();
    expect(events).toEqual(['+a']);
    admission.release(1);
    await flush();
    expect(events).toEqual(['+a', '+huge']);
    expect(admission.inFlight).toBe(10);
    admission.release(6); // 4 of `huge` still in: at capacity, `after` keeps waiting
    await flush();
    expect(events).toEqual(['+a', '+huge']);
    admission.release(1); // 3 in: `after` fits beside what is left of `huge`
    await flush();
    expect(events).toEqual(['+a', '+huge', '+after']);
    expect(admission.inFlight).toBe(4);
    // And on an idle server it goes straight in.
    const idle = new Admission(2);
    await idle.admit(5);
    expect(idle.inFlight).toBe(5);
  });

  type Op = { kind: 'admit'; n: number; abortable: boolean } | { kind: 'release'; pick: number } | { kind: 'abort'; pick: number };
  const CAPACITY = 5;
  const opArb: fc.Arbitrary<Op> = fc.oneof(
    { arbitrary: fc.record({ kind: fc.constant('admit' as const), n: fc.integer({ min: 1, max: CAPACITY * 2 }), abortable: fc.boolean() }), weight: 4 },
    { arbitrary: fc.record({ kind: fc.constant('release' as const), pick: fc.nat() }), weight: 3 },
    { arbitrary: fc.record({ kind: fc.constant('abort' as const), pick: fc.nat() }), weight: 1 },
  );

  it('property: never more than capacity admitted (unless one oversized request alone), FIFO, nothing lost', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(opArb, { minLength: 1, maxLength: 60 }), async (ops) => {
        const admission = new Admission(CAPACITY);
        interface Req {
          id: number;
          n: number;
          controller: AbortController | undefined;
          state: 'waiting' | 'admitted' | 'released' | 'rejected';
        }
        const requests: Req[] = [];
        const admittedOrder: number[] = [];
        const check = (): void => {
          const holders = requests.filter((r) => r.state === 'admitted');
          const held = holders.reduce((sum, r) => sum + r.n, 0);
          expect(admission.inFlight).toBe(held);
          if (held > CAPACITY) {
            expect(holders).toHaveLength(1);
            expect(holders[0]!.n).toBeGreaterThan(CAPACITY);
          }
          expect(admission.waiting).toBe(requests.filter((r) => r.state === 'waiting').length);
          // Nobody waits while the line's head would fit.
          const head = requests.find((r) => r.state === 'waiting');
          if (head) expect(held + head.n <= CAPACITY || held === 0).toBe(false);
        };
        for (const op of ops) {
          if (op.kind === 'admit') {
            const req: Req = { id: requests.length, n: op.n, controller: op.abortable ? new AbortController() : undefined, state: 'waiting' };
            requests.push(req);
            admission.admit(op.n, req.controller?.signal).then(
              () => {
                req.state = 'admitted';
                admittedOrder.push(req.id);
              },
              () => (req.state = 'rejected'),
            );
          } else if (op.kind === 'release') {
            const holders = requests.filter((r) => r.state === 'admitted');
            const req = holders[op.pick % Math.max(1, holders.length)];
            if (req) {
              req.state = 'released';
              admission.release(req.n);
            }
          } else {
            const abortable = requests.filter((r) => r.state === 'waiting' && r.controller);
            abortable[op.pick % Math.max(1, abortable.length)]?.controller?.abort(new Error('abort'));
          }
          await flush();
          check();
        }
        // Drain: releasing everything admits every remaining waiter, in order.
        for (let guard = 0; guard < 200 && requests.some((r) => r.state === 'waiting' || r.state === 'admitted'); guard++) {
          for (const r of requests.filter((x) => x.state === 'admitted')) {
            r.state = 'released';
            admission.release(r.n);
          }
          await flush();
          check();
        }
        expect(requests.filter((r) => r.state === 'waiting')).toEqual([]);
        expect(admission.inFlight).toBe(0);
        // FIFO: admissions happen in request order (rejected ones drop out).
        expect(admittedOrder).toEqual([...admittedOrder].sort((a, b) => a - b));
      }),
      { numRuns: 200 },
    );
  });
});

describe('Admission listeners', () => {
  it('removes its abort listener once a waiter is admitted (a stream-long signal does not collect them)', async () => {
    const admission = new Admission(1);
    const controller = new AbortController();
    let listeners = 0;
    const signal = controller.signal;
    const add = signal.addEventListener.bind(signal);
    const remove = signal.removeEventListener.bind(signal);
    signal.addEventListener = ((...args: Parameters<typeof add>) => {
      listeners++;
      add(...args);
    }) as typeof add;
    signal.removeEventListener = ((...args: Parameters<typeof remove>) => {
      listeners--;
      remove(...args);
    }) as typeof remove;
    await admission.admit(1, signal);
    for (let i = 0; i < 20; i++) {
      const waiting = admission.admit(1, signal);
      admission.release(1);
      await waiting;
    }
    expect(listeners).toBe(0);
  });
});
