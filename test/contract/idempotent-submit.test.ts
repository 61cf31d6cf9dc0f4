import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canonicalJson } from '../../src/pipeline/canonical-json.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import fc from 'fast-check';

describe('Submit is idempotent on task_id whatever the order of map and Struct keys', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({ engine: { policy: () => 'The answer is 4.' }, sandboxes: new NullSandboxDriver() });
  });
  afterAll(async () => h?.close());

  it('treats the same spec with instance and metadata keys in another order as a duplicate, and another spec as a conflict', async () => {
    const spec = {
      taskId: 'order-1',
      environment: 'math',
      numSamples: 2,
      instance: { problem: 'What is 2 + 2?', answer: '4', extra: { b: [1, { y: 2, x: 1 }], a: 'z' } },
      metadata: { step: '3', run: 'abc', epoch: '1' },
    };
    const first = await h.client.submit(spec);
    expect(first.duplicate).toBe(false);
    // The same task as a Go client might send it: every map and Struct written in another key order (the TS stub
    // encodes object keys in insertion order, so this really reaches the server in another wire order).
    const reordered = {
      metadata: { epoch: '1', run: 'abc', step: '3' },
      numSamples: 2,
      instance: { extra: { a: 'z', b: [1, { x: 1, y: 2 }] }, answer: '4', problem: 'What is 2 + 2?' },
      environment: 'math',
      taskId: 'order-1',
      // group_id spelled out as its default (task_id) is the same task too.
      groupId: 'order-1',
    };
    const again = await h.client.submit(reordered);
    expect(again).toEqual({ taskId: 'order-1', numSamples: 2, duplicate: true });
    // Array order means something: that is another spec, refused on task_id.
    const other = { ...spec, instance: { ...spec.instance, extra: { b: [{ y: 2, x: 1 }, 1], a: 'z' } } };
    await expect(h.client.submit(other)).rejects.toMatchObject({ details: expect.stringContaining('different spec') });
  });

  it('property: canonicalJson ignores key order at every depth and nothing else', () => {
    const shuffled = (value: unknown, rng: () => number): unknown => {
      if (Array.isArray(value)) return value.map((v) => shuffled(v, rng));
      if (value === null || typeof value !== 'object') return value;
      const entries = Object.entries(value).sort(() => rng() - 0.5);
      return Object.fromEntries(entries.map(([k, v]) => [k, shuffled(v, rng)]));
    };
    fc.assert(
      fc.property(fc.jsonValue(), fc.integer(), (value, seed) => {
        let state = seed;
        const rng = (): number => ((state = (state * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff);
        expect(canonicalJson(shuffled(value, rng))).toBe(canonicalJson(value));
        expect(JSON.parse(canonicalJson(value))).toEqual(JSON.parse(JSON.stringify(value)));
      }),
    );
    // Found by the property above: "__proto__" is an ordinary key in JSON and must survive sorting.
    expect(canonicalJson({ b: 1, ['__proto__']: 0 })).toBe(JSON.stringify(JSON.parse('{"__proto__":0,"b":1}')));
    expect(canonicalJson(JSON.parse('{"__proto__":{"y":1,"x":2}}'))).toBe('{"__proto__":{"x":2,"y":1}}');
  });
});
