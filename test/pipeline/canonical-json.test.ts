import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { canonicalJson } from '../../src/pipeline/canonical-json.js';

/** The same entries inserted in another order, at every depth (as another client's Struct or map would arrive). */
function shuffled(value: unknown, seed: number): unknown {
  if (Array.isArray(value)) return value.map((v) => shuffled(v, seed + 1));
  if (value === null || typeof value !== 'object') return value;
  const entries = Object.entries(value);
  const order = entries.map((_, k) => k).sort((a, b) => ((a * 7919 + seed) % 13) - ((b * 7919 + seed) % 13));
  const out: Record<string, unknown> = {};
  for (const k of order) Object.defineProperty(out, entries[k]![0], { value: shuffled(entries[k]![1], seed + k), enumerable: true, configurable: true, writable: true });
  return out;
}

describe('canonicalJson', () => {
  it('gives one string for values that differ only in key order, at any depth, and JSON that parses back to the value', () => {
    fc.assert(
      fc.property(fc.jsonValue(), fc.nat(), (value, seed) => {
        expect(canonicalJson(shuffled(value, seed))).toBe(canonicalJson(value));
        expect(JSON.parse(canonicalJson(value))).toEqual(JSON.parse(JSON.stringify(value)));
      }),
      { numRuns: 1000 },
    );
  });

  it('sorts keys at every depth, keeps array order, and treats "__proto__" as an ordinary key', () => {
    expect(canonicalJson({ b: 1, a: { d: [2, 1], c: null }, 10: 'x', 2: 'y' })).toBe('{"2":"y","10":"x","a":{"c":null,"d":[2,1]},"b":1}');
    const proto = JSON.parse('{"z":1,"__proto__":{"x":1}}') as unknown;
    expect(canonicalJson(proto)).toBe('{"__proto__":{"x":1},"z":1}');
    expect(canonicalJson([undefined, { u: undefined, v: 1 }])).toBe('[null,{"v":1}]');
  });
});
