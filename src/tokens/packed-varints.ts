import type { TokenIds } from '../backends/types.js';

/**
 * Token ids as the payload of a packed protobuf `repeated int32` field (the varints, without tag and length), made
 * once and kept with the ids.
 *
 * A trajectory carries its whole prompt (prompt_token_ids), and at 55K ids writing those varints was ~1 ms of the
 * event loop per delivered trajectory (the largest step of a 64K-token delivery). A prompt tokenized on a token thread
 * comes back with its varints written there (TokenTaskResult.promptVarints, transferred, not copied), attached to its
 * ids here; the trajectory encoder (pipeline/trajectory-encode.ts) copies them instead of encoding the ids again.
 *
 * Invariant: the attached bytes are exactly the packed varints of the ids; the array is never changed afterwards
 * (prompt ids are handed out read-only, as with attachIdsJson in backends/prompt-json.ts).
 */
const attached = new WeakMap<TokenIds, Uint8Array>();

/** Attaches `bytes` (which must be `packedVarints(ids)`) to `ids`, which must never change. */
export function attachVarints<T extends TokenIds>(ids: T, bytes: Uint8Array): T {
  attached.set(ids, bytes);
  return ids;
}

/** The packed varints attached to `ids`, if any. */
export function attachedVarints(ids: TokenIds): Uint8Array | undefined {
  return attached.get(ids);
}

/**
 * The packed varints of `ids`, or undefined when one is not a non-negative int32 (negative int32s take ten bytes
 * and anything else is refused by the generated encoder: such arrays are left to it).
 */
export function packedVarints(ids: ArrayLike<number>): Uint8Array | undefined {
  const size = packedVarintSize(ids);
  if (size < 0) return undefined;
  const out = new Uint8Array(size);
  let pos = 0;
  for (let i = 0; i < ids.length; i++) pos = writeVarint(out, pos, ids[i]!);
  return out;
}

/** Bytes of the packed varints of `values`, or -1 when one is not a non-negative int32. */
export function packedVarintSize(values: ArrayLike<number>): number {
  let size = 0;
  for (let i = 0; i < values.length; i++) {
    const v = values[i]!;
    // Non-negative int32: (v | 0) === v excludes fractions, NaN, and anything outside int32.
    if ((v | 0) !== v || v < 0) return -1;
    size += varintSize(v);
  }
  return size;
}

/** Bytes of one varint of a non-negative int32. */
export function varintSize(v: number): number {
  return v < 0x80 ? 1 : v < 0x4000 ? 2 : v < 0x200000 ? 3 : v < 0x10000000 ? 4 : 5;
}

/** Writes a non-negative int32 as a varint at `pos`; returns the position after it. */
export function writeVarint(out: Uint8Array, pos: number, v: number): number {
  while (v > 0x7f) {
    out[pos++] = (v & 0x7f) | 0x80;
    v >>>= 7;
  }
  out[pos++] = v;
  return pos;
}
