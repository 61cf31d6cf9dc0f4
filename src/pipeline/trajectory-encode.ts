import { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { attachedVarints, packedVarintSize, varintSize, writeVarint } from '../tokens/packed-varints.js';
import { promptIdsOf } from './lazy-prompt.js';

/**
 * `Trajectory.encode(t).finish()`, byte for byte, with the four token arrays written by a tight loop.
 *
 * Why: the generated encoder writes a packed field one value at a time through BinaryWriter (a range check, a
 * capacity check and, for floats, a DataView call per value, then a copy of the payload when the length prefix
 * widens): 1-6 ms on the event loop for a 64K-token trajectory, plus the garbage of a growing buffer. Here each
 * packed field's size is computed first and the values are written once into a buffer of the exact size.
 *
 * The bytes are the generated encoder's: the fields before the token arrays (1-7) and those after them (12-24) are
 * encoded by it, as two messages whose other fields are defaults (a message's encoding is the concatenation of its
 * fields', in field order), and the packed fields 8-11 between them exactly as it writes them (tag, varint length,
 * int32 varints or little-endian float32s). Values the generated encoder would refuse (not an int32, a finite double
 * beyond float32) or write differently (negative int32s, ten bytes each) are left to it: the whole trajectory is then
 * encoded by `Trajectory.encode`, which throws or writes them as it always did.
 *
 * A prompt whose varints are attached to its ids (a long prompt tokenized on a token thread, see
 * tokens/packed-varints.ts) is copied from them, not encoded again.
 */
export function encodeTrajectory(trajectory: Trajectory): Uint8Array {
  const { responseTokenIds, responseMask, responseLogprobs } = trajectory;
  // Not `trajectory.promptTokenIds`: that would make a lazily kept prompt's number[] (lazy-prompt.ts).
  const promptTokenIds = promptIdsOf(trajectory);
  const promptVarints = attachedVarints(promptTokenIds);
  const sizes = [promptVarints?.length ?? packedVarintSize(promptTokenIds), packedVarintSize(responseTokenIds), packedVarintSize(responseMask)];
  const floatsOk = responseLogprobs.every(isFloat32);
  if (sizes.some((s) => s < 0) || !floatsOk) return Trajectory.encode(trajectory).finish();

  const head = Trajectory.encode(only(trajectory, HEAD_FIELDS)).finish();
  const tail = Trajectory.encode(only(trajectory, TAIL_FIELDS)).finish();

  const floatBytes = 4 * responseLogprobs.length;
  let packed = 0;
  for (const size of sizes) packed += size === 0 ? 0 : 1 + varintSize(size) + size;
  if (floatBytes > 0) packed += 1 + varintSize(floatBytes) + floatBytes;

  const out = new Uint8Array(head.length + packed + tail.length);
  out.set(head, 0);
  let pos = head.length;
  if (promptVarints !== undefined) pos = writeBytes(out, pos, FIELD_TAGS[0]!, promptVarints);
  else pos = writeVarints(out, pos, FIELD_TAGS[0]!, promptTokenIds, sizes[0]!);
  pos = writeVarints(out, pos, FIELD_TAGS[1]!, responseTokenIds, sizes[1]!);
  pos = writeVarints(out, pos, FIELD_TAGS[2]!, responseMask, sizes[2]!);
  if (floatBytes > 0) {
    out[pos++] = FIELD_TAGS[3]!;
    pos = writeVarint(out, pos, floatBytes);
    const view = new DataView(out.buffer, out.byteOffset, out.byteLength);
    for (let i = 0; i < responseLogprobs.length; i++, pos += 4) view.setFloat32(pos, responseLogprobs[i]!, true);
  }
  out.set(tail, pos);
  return out;
}

/** A trajectory with every field at its default (encodes to nothing). */
const EMPTY: Trajectory = Trajectory.fromPartial({});

/** The fields before the token arrays (1-7). */
const HEAD_FIELDS: readonly (keyof Trajectory)[] = ['taskId', 'sampleIndex', 'groupId', 'environment', 'status', 'finishReason', 'error'];
/** The token arrays (8-11), written here. */
const TOKEN_FIELDS: readonly (keyof Trajectory)[] = ['promptTokenIds', 'responseTokenIds', 'responseMask', 'responseLogprobs'];
/** The fields after the token arrays (12-24). */
const TAIL_FIELDS = (Object.keys(EMPTY) as (keyof Trajectory)[]).filter((k) => !HEAD_FIELDS.includes(k) && !TOKEN_FIELDS.includes(k));

/**
 * The trajectory with only `fields` set, the rest at their defaults. Each of those fields is read once and no other
 * is read: a spread would read the prompt's ids and make a lazily kept prompt's number[] (lazy-prompt.ts).
 */
function only(trajectory: Trajectory, fields: readonly (keyof Trajectory)[]): Trajectory {
  const out: Record<string, unknown> = { ...EMPTY };
  for (const k of fields) out[k] = trajectory[k];
  return out as unknown as Trajectory;
}

/** Tags of prompt_token_ids (8), response_token_ids (9), response_mask (10): wire type 2; response_logprobs (11). */
const FIELD_TAGS = [(8 << 3) | 2, (9 << 3) | 2, (10 << 3) | 2, (11 << 3) | 2] as const;

/** What the generated encoder's float() accepts: a number whose float32 rounding is finite unless it already was not. */
function isFloat32(v: number): boolean {
  return typeof v === 'number' && (Number.isFinite(Math.fround(v)) || !Number.isFinite(v));
}

function writeVarints(out: Uint8Array, pos: number, tag: number, values: ArrayLike<number>, size: number): number {
  if (size === 0) return pos;
  out[pos++] = tag;
  pos = writeVarint(out, pos, size);
  for (let i = 0; i < values.length; i++) pos = writeVarint(out, pos, values[i]!);
  return pos;
}

function writeBytes(out: Uint8Array, pos: number, tag: number, bytes: Uint8Array): number {
  if (bytes.length === 0) return pos;
  out[pos++] = tag;
  pos = writeVarint(out, pos, bytes.length);
  out.set(bytes, pos);
  return pos + bytes.length;
}
