import { closeSync, fsyncSync, openSync, writeSync } from 'node:fs';

/**
 * A GGUF v3 file writer: the container llama.cpp loads models from. Only what a model needs is written —
 * scalars, strings, arrays of them, and F32/F16 tensors — with the layout of the spec
 * (github.com/ggml-org/ggml docs/gguf.md):
 *
 *   magic "GGUF" · version u32 = 3 · tensor_count u64 · kv_count u64
 *   kv*:     key (u64 length + UTF-8) · value_type u32 · value
 *   tensor*: name · n_dims u32 · dims u64[n_dims] (innermost first) · ggml_type u32 · offset u64
 *   padding to `general.alignment` (32) · tensor data, each tensor starting at a multiple of the alignment
 *
 * All integers little-endian. Invariants: a tensor's element count equals the product of its dims; offsets are
 * relative to the start of the data section and aligned; the file is written in one pass, so its bytes depend only
 * on the inputs (the tiny model's cache key relies on it).
 */

/** GGUF metadata value types (gguf_type). */
export const GgufType = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;

/** One metadata value, typed explicitly because GGUF distinguishes u32 from i32 from f32. */
export type GgufValue =
  | { type: 'u32'; value: number }
  | { type: 'i32'; value: number }
  | { type: 'f32'; value: number }
  | { type: 'bool'; value: boolean }
  | { type: 'string'; value: string }
  | { type: 'string[]'; value: readonly string[] }
  | { type: 'i32[]'; value: ArrayLike<number> };

/** A tensor to write: data is F32; `f16` stores it as IEEE half (norm weights must stay F32 in llama.cpp). */
export interface GgufTensor {
  name: string;
  /** ggml order: innermost (row length) first, e.g. token_embd is [n_embd, n_vocab]. */
  dims: readonly number[];
  data: Float32Array;
  f16?: boolean;
}

export const GGUF_ALIGNMENT = 32;
const GGML_TYPE_F32 = 0;
const GGML_TYPE_F16 = 1;

/** Appends little-endian primitives to a growing list of buffers (the header is a few MB for a 150K vocabulary). */
class ByteSink {
  readonly parts: Buffer[] = [];
  length = 0;
  push(buf: Buffer): void {
    this.parts.push(buf);
    this.length += buf.length;
  }
  u32(n: number): void {
    const b = Buffer.allocUnsafe(4);
    b.writeUInt32LE(n);
    this.push(b);
  }
  i32(n: number): void {
    const b = Buffer.allocUnsafe(4);
    b.writeInt32LE(n);
    this.push(b);
  }
  u64(n: number): void {
    const b = Buffer.allocUnsafe(8);
    b.writeBigUInt64LE(BigInt(n));
    this.push(b);
  }
  f32(n: number): void {
    const b = Buffer.allocUnsafe(4);
    b.writeFloatLE(n);
    this.push(b);
  }
  string(s: string): void {
    const bytes = Buffer.from(s, 'utf8');
    this.u64(bytes.length);
    this.push(bytes);
  }
  pad(alignment: number): void {
    const rem = this.length % alignment;
    if (rem !== 0) this.push(Buffer.alloc(alignment - rem));
  }
}

function writeValue(sink: ByteSink, v: GgufValue): void {
  switch (v.type) {
    case 'u32':
      sink.u32(GgufType.UINT32);
      return sink.u32(v.value);
    case 'i32':
      sink.u32(GgufType.INT32);
      return sink.i32(v.value);
    case 'f32':
      sink.u32(GgufType.FLOAT32);
      return sink.f32(v.value);
    case 'bool':
      sink.u32(GgufType.BOOL);
      return sink.push(Buffer.from([v.value ? 1 : 0]));
    case 'string':
      sink.u32(GgufType.STRING);
      return sink.string(v.value);
    case 'string[]':
      sink.u32(GgufType.ARRAY);
      sink.u32(GgufType.STRING);
      sink.u64(v.value.length);
      for (const s of v.value) sink.string(s);
      return;
    case 'i32[]': {
      sink.u32(GgufType.ARRAY);
      sink.u32(GgufType.INT32);
      sink.u64(v.value.length);
      const b = Buffer.allocUnsafe(4 * v.value.length);
      for (let i = 0; i < v.value.length; i++) b.writeInt32LE(v.value[i]!, 4 * i);
      return sink.push(b);
    }
  }
}

/** IEEE 754 binary16 bits of a float (round half away from zero; subnormals kept, overflow to ±inf). */
export function toFloat16Bits(value: number): number {
  F32[0] = value;
  const x = U32[0]!;
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant !== 0 ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    let half = mant >>> shift;
    if ((mant >>> (shift - 1)) & 1) half++;
    return sign | half;
  }
  let half = sign | (e << 10) | (mant >>> 13);
  if (mant & 0x1000) half++; // a carry into the exponent is the correct rounding
  return half;
}
const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

function tensorBytes(t: GgufTensor): Buffer {
  if (!t.f16) return Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  const out = Buffer.allocUnsafe(2 * t.data.length);
  for (let i = 0; i < t.data.length; i++) out.writeUInt16LE(toFloat16Bits(t.data[i]!), 2 * i);
  return out;
}

/**
 * Writes a GGUF v3 file at `path` (overwriting it). `metadata` keys are written in insertion order;
 * `general.alignment` is added when absent. Throws when a tensor's data does not match its dims.
 */
export function writeGguf(path: string, metadata: ReadonlyMap<string, GgufValue>, tensors: readonly GgufTensor[]): void {
  const kv = new Map(metadata);
  if (!kv.has('general.alignment')) kv.set('general.alignment', { type: 'u32', value: GGUF_ALIGNMENT });
  const header = new ByteSink();
  header.push(Buffer.from('GGUF', 'ascii'));
  header.u32(3);
  header.u64(tensors.length);
  header.u64(kv.size);
  for (const [key, value] of kv) {
    header.string(key);
    writeValue(header, value);
  }
  const blobs: Buffer[] = [];
  let offset = 0;
  for (const t of tensors) {
    const count = t.dims.reduce((a, b) => a * b, 1);
    if (count !== t.data.length) throw new Error(`tensor ${t.name}: ${t.data.length} values for dims [${t.dims.join(', ')}]`);
    header.string(t.name);
    header.u32(t.dims.length);
    for (const d of t.dims) header.u64(d);
    header.u32(t.f16 ? GGML_TYPE_F16 : GGML_TYPE_F32);
    header.u64(offset);
    const bytes = tensorBytes(t);
    blobs.push(bytes);
    const padded = Math.ceil(bytes.length / GGUF_ALIGNMENT) * GGUF_ALIGNMENT;
    if (padded > bytes.length) blobs.push(Buffer.alloc(padded - bytes.length));
    offset += padded;
  }
  header.pad(GGUF_ALIGNMENT);
  const fd = openSync(path, 'w');
  try {
    writeSync(fd, Buffer.concat(header.parts, header.length)); // one write, not one per token string
    for (const blob of blobs) writeSync(fd, blob);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}
