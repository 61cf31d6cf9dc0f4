import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { canonicalJson } from '../../src/pipeline/canonical-json.js';

/** The first implementation, kept as the reference: a copy with keys inserted in sorted order, then JSON.stringify. */
function reference(value: unknown): string {
  const sortKeys = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(sortKeys);
    if (v === null || typeof v !== 'object') return v;
    const out = Object.create(null) as Record<string, unknown>;
    for (const key of Object.keys(v).sort()) out[key] = sortKeys((v as Record<string, unknown>)[key]);
    return out;
  };
  return JSON.stringify(sortKeys(value));
}

/** Keys that order differently by code units, numerically and by insertion, and the ones objects treat specially. */
const key = fc.oneof(
  fc.string({ maxLength: 6 }),
  fc.constantFrom('0', '1', '2', '10', '01', '-1', '1.5', '4294967294', '4294967295', '99999999999', '__proto__', 'constructor', 'toString', 'é', '\u{1F600}', 'a\nb', ''),
  fc.nat().map(String),
);
const scalar = fc.oneof(fc.string(), fc.double(), fc.integer(), fc.boolean(), fc.constant(null), fc.constant(undefined), fc.constantFrom(-0, Number.NaN, Infinity, 1e21, 5e-7));
const { value } = fc.letrec((tie) => ({
  value: fc.oneof({ depthSize: 'small' }, scalar, tie('array'), tie('object')),
  array: fc.array(tie('value'), { maxLength: 5 }),
  object: fc.array(fc.tuple(key, tie('value')), { maxLength: 6 }).map((entries) => {
    // Defined as own properties, so "__proto__" is a key like any other (as a decoded Struct has it).
    const o: Record<string, unknown> = {};
    for (const [k, v] of entries) Object.defineProperty(o, k, { value: v, enumerable: true, configurable: true, writable: true });
    return o;
  }),
}));

describe('canonicalJson', () => {
  it('is byte for byte the sorted-copy JSON it replaced (persisted strings: dataset task ids)', () => {
    fc.assert(fc.property(value, (v) => {
      expect(canonicalJson(v)).toBe(reference(v));
    }), { numRuns: 3000 });
    fc.assert(fc.property(fc.jsonValue(), (v) => {
      expect(canonicalJson(v)).toBe(reference(v));
    }), { numRuns: 1000 });
  });

  it('gives equal strings for values that differ only in key order, and keeps array order', () => {
    expect(canonicalJson({ b: 1, a: { d: [2, 1], c: null }, 10: 'x', 2: 'y' })).toBe('{"2":"y","10":"x","a":{"c":null,"d":[2,1]},"b":1}');
    expect(canonicalJson({ 2: 'y', 10: 'x', a: { c: null, d: [2, 1] }, b: 1 })).toBe(canonicalJson({ b: 1, a: { d: [2, 1], c: null }, 10: 'x', 2: 'y' }));
    expect(canonicalJson([undefined, () => 1, { u: undefined }])).toBe('[null,null,{}]');
    expect(() => canonicalJson({ n: 1n })).toThrow(TypeError);
  });
});
