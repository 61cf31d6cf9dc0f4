import { describe, expect, it } from 'vitest';
import { numbersOf, numbersPending, setLazyNumbers } from '../../src/tokens/lazy-numbers.js';
import { TokenLedger } from '../../src/tokens/ledger.js';
import { loadFamily } from './families.js';

interface Holder {
  ids: number[];
  other: number;
}

describe('lazily kept number fields', () => {
  it('are read without a number[] through numbersOf, and made once on the first read; then a plain field', () => {
    const h = { other: 1 } as Holder;
    const view = Int32Array.from([3, 1, 4, 1, 5]);
    setLazyNumbers(h, 'ids', view);
    expect(numbersPending(h, 'ids')).toBe(true);
    expect(numbersOf(h, 'ids')).toBe(view);
    const first = h.ids;
    expect(first).toEqual([3, 1, 4, 1, 5]);
    expect(Array.isArray(first)).toBe(true);
    expect(numbersPending(h, 'ids')).toBe(false);
    expect(h.ids).toBe(first);
    expect(numbersOf(h, 'ids')).toBe(first);
    expect(Object.getOwnPropertyDescriptor(h, 'ids')).toMatchObject({ value: first, writable: true, enumerable: true });
  });

  it('read as ordinary fields to spreads, JSON and equality, and can be assigned', () => {
    const make = (): Holder => {
      const h = { other: 2 } as Holder;
      setLazyNumbers(h, 'ids', Float64Array.from([-0.5, 0, 1.25]));
      return h;
    };
    expect({ ...make() }).toEqual({ other: 2, ids: [-0.5, 0, 1.25] });
    expect(JSON.parse(JSON.stringify(make()))).toEqual({ other: 2, ids: [-0.5, 0, 1.25] });
    expect(make()).toEqual({ other: 2, ids: [-0.5, 0, 1.25] });
    const assigned = make();
    assigned.ids = [9];
    expect(numbersPending(assigned, 'ids')).toBe(false);
    expect(assigned.ids).toEqual([9]);
    expect(numbersOf(assigned, 'ids')).toEqual([9]);
  });

  it('keep a number[] as is (shared, not copied)', () => {
    const h = { other: 3 } as Holder;
    const ids = [1, 2];
    setLazyNumbers(h, 'ids', ids);
    expect(numbersPending(h, 'ids')).toBe(false);
    expect(h.ids).toBe(ids);
  });

  it('are how a ledger snapshot holds its columns: the values it recorded, unchanged by what the ledger records later', async () => {
    const { tokenizer, template } = await loadFamily('qwen3');
    const ledger = await TokenLedger.create({ tokenizer, template, messages: [{ role: 'user', content: 'What is 2 + 2?' }] });
    const answer = tokenizer.encode('It is 4.');
    ledger.appendSampled({ tokenIds: [...answer, tokenizer.stopTokenIds[0]!], logprobs: [...answer.map(() => -0.5), -0.125], backend: 'b', policyVersion: 1, finishReason: 'stop' });
    const snapshot = ledger.snapshot();
    expect(numbersPending(snapshot, 'responseIds')).toBe(true);
    expect(numbersPending(snapshot, 'mask')).toBe(true);
    expect(numbersPending(snapshot, 'logprobs')).toBe(true);
    await ledger.appendEnvironment([{ role: 'user', content: 'And 3 + 3?' }]);
    const n = answer.length + 1;
    expect(snapshot.responseIds).toEqual([...answer, tokenizer.stopTokenIds[0]]);
    expect(snapshot.mask).toEqual(new Array<number>(n).fill(1));
    expect(snapshot.logprobs).toEqual([...answer.map(() => -0.5), -0.125]);
    expect(ledger.snapshot().responseIds.length).toBeGreaterThan(n);
  });
});
