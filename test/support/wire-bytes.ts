import { BinaryWriter, WireType } from '@bufbuild/protobuf/wire';
import fc from 'fast-check';

/**
 * Hand-made protobuf bytes for wire-level fuzzing: what no generated encoder would write (wrong wire types,
 * lengths past the end, invalid UTF-8 in a string, fields the contract does not have), built field by field so a
 * test knows which field it broke.
 */

/** One field as written on the wire: its number, wire type and raw payload (for LEN: the bytes after the length). */
export interface RawField {
  no: number;
  wireType: WireType;
  /** varint value (VARINT), 4/8 raw bytes (I32/I64), content (LEN), or nothing (group markers). */
  payload: Uint8Array | bigint;
  /** For LEN: the length to declare instead of the payload's (a length past the end of the message). */
  declaredLength?: number;
}

/** Encodes fields in order, honouring `declaredLength` and wire types that do not match the contract. */
export function encodeFields(fields: readonly RawField[]): Uint8Array {
  const w = new BinaryWriter();
  for (const f of fields) {
    w.tag(f.no, f.wireType);
    switch (f.wireType) {
      case WireType.Varint:
        w.uint64(typeof f.payload === 'bigint' ? f.payload : 0n);
        break;
      case WireType.Bit32:
      case WireType.Bit64:
      case WireType.StartGroup:
      case WireType.EndGroup:
        if (f.payload instanceof Uint8Array) w.raw(f.payload);
        break;
      case WireType.LengthDelimited: {
        const bytes = f.payload instanceof Uint8Array ? f.payload : new Uint8Array();
        w.uint32(f.declaredLength ?? bytes.length);
        w.raw(bytes);
        break;
      }
    }
  }
  return w.finish();
}

export const len = (no: number, payload: Uint8Array, declaredLength?: number): RawField => ({
  no,
  wireType: WireType.LengthDelimited,
  payload,
  ...(declaredLength !== undefined && { declaredLength }),
});
export const varint = (no: number, value: bigint): RawField => ({ no, wireType: WireType.Varint, payload: value });
export const utf8 = (s: string): Uint8Array => new TextEncoder().encode(s);

/** Byte sequences that are not UTF-8: a stray continuation, an overlong '/', a lone surrogate, a cut 3-byte char. */
export const INVALID_UTF8: readonly Uint8Array[] = [
  Uint8Array.of(0xff),
  Uint8Array.of(0x80, 0x41),
  Uint8Array.of(0xc0, 0xaf),
  Uint8Array.of(0xed, 0xa0, 0x80),
  Uint8Array.of(0xe2, 0x82),
  Uint8Array.of(0xf8, 0x88, 0x80, 0x80, 0x80),
];

/** `a` with `b` inside it at `at`. */
export function splice(a: Uint8Array, at: number, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a.subarray(0, at));
  out.set(b, at);
  out.set(a.subarray(at), at + b.length);
  return out;
}

/** An unknown field with any valid wire type and payload (a newer client's field). */
export const unknownField = (): fc.Arbitrary<RawField> =>
  fc.oneof(
    fc.record({ no: fc.integer({ min: 1000, max: 536_870_911 }), v: fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }) }).map(({ no, v }) => varint(no, v)),
    fc.record({ no: fc.integer({ min: 1000, max: 536_870_911 }), b: fc.uint8Array({ maxLength: 32 }) }).map(({ no, b }) => len(no, b)),
    fc.record({ no: fc.integer({ min: 1000, max: 536_870_911 }), b: fc.uint8Array({ minLength: 4, maxLength: 4 }) }).map(({ no, b }): RawField => ({ no, wireType: WireType.Bit32, payload: b })),
    fc.record({ no: fc.integer({ min: 1000, max: 536_870_911 }), b: fc.uint8Array({ minLength: 8, maxLength: 8 }) }).map(({ no, b }): RawField => ({ no, wireType: WireType.Bit64, payload: b })),
  );

/** Mutations of a valid encoding: truncation, overwritten bytes, inserted bytes, a duplicated slice. */
export const mutationOf = (valid: Uint8Array): fc.Arbitrary<Uint8Array> =>
  fc.oneof(
    fc.nat(valid.length - 1).map((n) => valid.subarray(0, n)),
    fc.array(fc.record({ at: fc.nat(valid.length - 1), byte: fc.integer({ min: 0, max: 255 }) }), { minLength: 1, maxLength: 4 }).map((edits) => {
      const copy = Uint8Array.from(valid);
      for (const { at, byte } of edits) copy[at] = byte;
      return copy;
    }),
    fc.record({ at: fc.nat(valid.length), bytes: fc.uint8Array({ minLength: 1, maxLength: 8 }) }).map(({ at, bytes }) => splice(valid, at, bytes)),
    fc.record({ from: fc.nat(valid.length - 1), n: fc.integer({ min: 1, max: 16 }) }).map(({ from, n }) => splice(valid, from, valid.subarray(from, from + n))),
  );
