import { BinaryReader, WireType } from '@bufbuild/protobuf/wire';
import { isUtf8 } from 'node:buffer';
import protobuf from 'protobufjs';
import { fileURLToPath } from 'node:url';

const PROTO_DIR = fileURLToPath(new URL('../../proto/', import.meta.url));

/**
 * Why a request's bytes could not be decoded, by field: `field` is the proto path below the request
 * (e.g. "task.sampling.seed", "task.instance"); empty when the bytes are not a valid message at all.
 */
export interface DecodeDiagnosis {
  field: string;
  reason: string;
  /** The task_id found in the bytes (task.task_id), so the rejection can name the task. */
  taskId: string;
}

/**
 * The limits of the generated (ts-proto) decoders, restated so that a walk can say which field broke them:
 * 64-bit integers must be exact as JS numbers (`forceLong=number`), and messages may nest at
 * most 100 levels (ts-proto's recursion guard counts every message and map entry; one level of a Struct is
 * three: Struct, its entry, Value).
 */
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const MAX_RECURSION = 100;
/** A field holding one of these is named as a whole: its inner path says nothing to a trainer. */
const STRUCT_TYPES = new Set(['.google.protobuf.Struct', '.google.protobuf.Value', '.google.protobuf.ListValue']);
const INT64_TYPES = new Set(['int64', 'uint64', 'sint64', 'fixed64', 'sfixed64']);

let root: protobuf.Root | undefined;

/** The contract's schema (proto names, snake_case), parsed once from proto/ on first use. */
export function contractSchema(): protobuf.Root {
  if (root) return root;
  const r = new protobuf.Root();
  r.resolvePath = (_origin, target) => (target.startsWith('google/protobuf/') ? target : `${PROTO_DIR}${target}`);
  r.loadSync(['rollout/v1/rollout.proto', 'rollout/v1/backend.proto', 'rollout/v1/admin.proto'], { keepCase: true });
  r.resolveAll();
  root = r;
  return r;
}

class Finding extends Error {
  constructor(
    readonly field: string,
    readonly reason: string,
    readonly taskId?: string,
  ) {
    super(`${field}: ${reason}`);
  }
}

/**
 * Walks the wire bytes of a `typeName` message that failed to decode and names the first field that breaks the
 * generated decoder's rules (an int64 outside ±(2^53−1), a Struct nested too deep, a truncated or malformed
 * field). It runs only after a decode failed, so the happy path pays nothing. A Struct's inner path is not
 * spelled out: the field that holds the Struct is named ("task.instance").
 */
export function diagnoseDecodeFailure(bytes: Uint8Array, typeName: string, error: unknown): DecodeDiagnosis {
  const found = { taskId: '' };
  try {
    walk(new BinaryReader(bytes), bytes.length, contractSchema().lookupType(typeName), '', 0, undefined, found);
  } catch (err) {
    if (err instanceof Finding) return { field: err.field, reason: err.reason, taskId: found.taskId };
    return { field: '', reason: `not a valid ${typeName}: ${message(err)}`, taskId: found.taskId };
  }
  return { field: '', reason: `not a valid ${typeName}: ${message(error)}`, taskId: found.taskId };
}

/**
 * For a request that decodes but is over the size limit: the task_id in it and its largest field below the
 * request (e.g. "task.metadata"), so the rejection can say what to shrink.
 */
export function largestField(bytes: Uint8Array, typeName: string): { field: string; bytes: number; taskId: string } {
  const type = contractSchema().lookupType(typeName);
  const reader = new BinaryReader(bytes);
  let best = { field: '', bytes: 0 };
  let taskId = '';
  try {
    while (reader.pos < bytes.length) {
      const [number, wireType] = reader.tag();
      const start = reader.pos;
      const field = type.fieldsById[number];
      if (field?.resolvedType instanceof protobuf.Type && wireType === WireType.LengthDelimited) {
        // One level down (the task inside a request): its fields are what a client can shrink.
        const end = reader.uint32() + reader.pos;
        const inner = field.resolvedType;
        while (reader.pos < end) {
          const [n, wt] = reader.tag();
          const at = reader.pos;
          const innerField = inner.fieldsById[n];
          // The rejection names the task by an id it could have (an id of megabytes would outgrow the answer).
          if (innerField?.name === 'task_id' && wt === WireType.LengthDelimited) taskId = boundedString(reader, 1024) ?? '';
          else reader.skip(wt, n);
          const name = `${field.name}.${innerField?.name ?? n}`;
          if (reader.pos - at > best.bytes) best = { field: name, bytes: reader.pos - at };
        }
      } else {
        reader.skip(wireType, number);
        if (reader.pos - start > best.bytes) best = { field: field?.name ?? String(number), bytes: reader.pos - start };
      }
    }
  } catch {
    // A malformed tail: what was found so far is the answer.
  }
  return { ...best, taskId };
}

/** Reads a string field's value: undefined (skipped) when it is over `maxBytes`. */
function boundedString(reader: BinaryReader, maxBytes: number): string | undefined {
  const at = reader.pos;
  const length = reader.uint32();
  if (length <= maxBytes) {
    reader.pos = at;
    return reader.string();
  }
  reader.pos += length;
  return undefined;
}

/**
 * The checks a request that did decode still needs, for `typeName`: the generated decoder accepts three things the
 * contract does not mean, and answers none of them. A field of the contract sent with a wire type it cannot have
 * (num_samples as a string, a temperature as a varint — an older or hand-made stub) is skipped, so the task would
 * run with that field at its default; it is refused naming the field. A request that is a oneof of kinds
 * (RolloutRequest) with no kind set — its only field sent with the wrong wire type, a kind this server does not
 * know, nothing at all — would be skipped without an answer; it is refused naming the field the bytes show, or
 * `kind`. A string that is not valid UTF-8 (proto3 requires it) would be decoded with U+FFFD in place, silently
 * another task_id; it is refused naming the field. Every request's bytes are walked once for wire types (nested
 * messages entered, every other value skipped by its length); they are walked for UTF-8 only when the decoded
 * object holds a U+FFFD, and a U+FFFD sent as valid UTF-8 passes.
 */
export function decodedChecks(typeName: string): (bytes: Uint8Array, decoded: unknown) => DecodeDiagnosis | undefined {
  const type = contractSchema().lookupType(typeName);
  const kinds = type.oneofsArray.find((o) => o.fieldsArray.length === type.fieldsArray.length && o.fieldsArray.length > 1);
  const kindKey = kinds && protobuf.util.camelCase(kinds.name);
  // Wire types first: a kind sent with the wrong one is what leaves a request without a kind, and is named as such.
  const checks: ((bytes: Uint8Array, decoded: unknown) => void)[] = [
    (bytes, decoded) => wrongWireType(new BinaryReader(bytes), bytes.length, type, '', taskIdOf(decoded)),
    (bytes, decoded) => {
      if (kinds && kindKey && (decoded as Record<string, unknown>)[kindKey] === undefined) noKind(bytes, kinds);
    },
    (bytes, decoded) => {
      if (holdsReplacement(decoded, 0)) invalidUtf8(bytes, new BinaryReader(bytes), bytes.length, type, '', { taskId: '' });
    },
  ];
  return (bytes, decoded) => {
    for (const check of checks) {
      try {
        check(bytes, decoded);
      } catch (err) {
        if (err instanceof Finding) return { field: err.field, reason: err.reason, taskId: err.taskId ?? '' };
        // A walk that stumbles on bytes the generated decoder never read (it stops at a zero tag or an end-group
        // marker) proves nothing about them: that check passes, and the next one still runs.
      }
    }
    return undefined;
  };
}

/** The wire type a value of `field` is written with (a repeated number may also come packed, as wire type 2). */
export function wireTypeOf(type: string, resolved: protobuf.Type | protobuf.Enum | null): WireType {
  if (resolved instanceof protobuf.Type) return WireType.LengthDelimited;
  if (resolved instanceof protobuf.Enum) return WireType.Varint;
  const basic = (protobuf.types.basic as Record<string, number | undefined>)[type];
  return basic === undefined ? WireType.LengthDelimited : (basic as WireType);
}

export const WIRE_TYPE_NAMES = ['varint', '64-bit', 'length-delimited', 'group start', 'group end', '32-bit'];

/**
 * Throws the Finding for the first field of the contract whose wire type is not its own (message, map entry and
 * Struct fields included); unknown fields are skipped (a newer client's). The Finding names `taskId`.
 */
function wrongWireType(reader: BinaryReader, end: number, type: protobuf.Type, path: string, taskId: string): void {
  eachKnownField(reader, end, type, path, (field, wireType, name, number) => {
    const expected = field.map ? WireType.LengthDelimited : wireTypeOf(field.type, field.resolvedType);
    const packed = field.repeated && expected !== WireType.LengthDelimited && wireType === WireType.LengthDelimited;
    if (wireType !== expected && !packed) {
      const what = field.map ? 'a map' : field.resolvedType instanceof protobuf.Type ? 'a message' : field.type;
      throw new Finding(name(), `wrong wire type: ${field.name} is ${what} (${WIRE_TYPE_NAMES[expected]}), sent as ${WIRE_TYPE_NAMES[wireType] ?? String(wireType)}`, taskId);
    }
    if (field.map && field instanceof protobuf.MapField) {
      const entryEnd = reader.uint32() + reader.pos;
      const valueType = field.resolvedType instanceof protobuf.Type ? field.resolvedType : null;
      while (reader.pos < entryEnd) {
        const [n, wt] = reader.tag();
        const want = n === 1 ? wireTypeOf(field.keyType, null) : n === 2 ? wireTypeOf(field.type, field.resolvedType) : undefined;
        if (want !== undefined && wt !== want) {
          throw new Finding(name(), `wrong wire type in a ${n === 1 ? 'key' : 'value'} (${WIRE_TYPE_NAMES[want]} expected, sent as ${WIRE_TYPE_NAMES[wt] ?? String(wt)})`, taskId);
        }
        if (n === 2 && valueType) {
          const valueEnd = reader.uint32() + reader.pos;
          wrongWireType(reader, valueEnd, valueType, name(), taskId);
          reader.pos = valueEnd;
        } else reader.skip(wt, n);
      }
      reader.pos = entryEnd;
    } else if (field.resolvedType instanceof protobuf.Type) {
      const fieldEnd = reader.uint32() + reader.pos;
      wrongWireType(reader, fieldEnd, field.resolvedType, name(), taskId);
      reader.pos = fieldEnd;
    } else {
      reader.skip(wireType, number);
    }
  });
}

/**
 * Calls `visit` for each field of `type` in the bytes up to `end` that the schema knows (others are skipped), with
 * its wire type and its name below `path` — a Struct, Value or ListValue adds no name of its own: its place is the
 * path of the field (or key) holding it. `visit` leaves the reader after the field. The name is spelled out only
 * when asked for (`name()`, one function per message walked): wrongWireType runs on every request and needs a
 * field's path only to name it in a Finding or to descend.
 */
function eachKnownField(
  reader: BinaryReader,
  end: number,
  type: protobuf.Type,
  path: string,
  visit: (field: protobuf.Field, wireType: WireType, name: () => string, number: number) => void,
): void {
  const transparent = STRUCT_TYPES.has(type.fullName);
  let current: protobuf.Field | undefined;
  const name = (): string => (transparent ? path : path ? `${path}.${current!.name}` : current!.name);
  while (reader.pos < end) {
    const [number, wireType] = reader.tag();
    const field = type.fieldsById[number];
    if (field) {
      current = field;
      visit(field, wireType, name, number);
    } else reader.skip(wireType, number);
  }
}

/** The id of the task a decoded request carries (a stream's task kind, Submit's task), as the client knows it. */
function taskIdOf(decoded: unknown): string {
  const r = decoded as { kind?: { $case?: string; value?: { taskId?: unknown } }; task?: { taskId?: unknown } } | null;
  const id = r?.kind?.$case === 'task' ? r.kind.value?.taskId : r?.task?.taskId;
  return typeof id === 'string' && !id.includes('\uFFFD') ? id : '';
}

/** Throws the Finding for a request of kinds `oneof` with none set and none broken (wrongWireType names that): `kind`. */
function noKind(bytes: Uint8Array, oneof: protobuf.OneOf): never {
  const reader = new BinaryReader(bytes);
  const unknown: number[] = [];
  try {
    while (reader.pos < bytes.length) {
      // A kind sent with the wrong wire type was named by wrongWireType, which runs first.
      const [number, wireType] = reader.tag();
      if (!oneof.fieldsArray.some((f) => f.id === number)) unknown.push(number);
      reader.skip(wireType, number);
    }
  } catch {
    // The generated decoder stops quietly at a zero tag or an end-group marker; what follows is not read.
  }
  const known = oneof.fieldsArray.map((f) => f.name).join(', ');
  const got = unknown.length ? `only field${unknown.length > 1 ? 's' : ''} ${[...new Set(unknown)].join(', ')}, unknown to this server` : 'an empty request';
  throw new Finding(oneof.name, `no ${oneof.name} set (${got}); this server knows ${known}`);
}

/** Whether a decoded request holds U+FFFD in a string or a key (where invalid UTF-8 would have left it). */
function holdsReplacement(value: unknown, depth: number): boolean {
  if (typeof value === 'string') return value.includes('\uFFFD');
  if (typeof value !== 'object' || value === null || depth > 256) return false;
  if (Array.isArray(value)) {
    // Token ids and logprobs: nothing to look at.
    if (typeof value[0] === 'number') return false;
    for (const v of value) if (holdsReplacement(v, depth + 1)) return true;
    return false;
  }
  if (ArrayBuffer.isView(value)) return false;
  // for…in, not Object.entries: this runs on every request, and allocates nothing.
  const record = value as Record<string, unknown>;
  for (const k in record) {
    if (k.includes('\uFFFD') || holdsReplacement(record[k], depth + 1)) return true;
  }
  return false;
}

/**
 * Walks a decoded request's bytes for the first string (or map/Struct key) that is not valid UTF-8. Paths are
 * proto names below the request, a map's or Struct's entries named by key ("task.instance.answer",
 * "task.metadata.k"); a key that is itself not UTF-8 is named by its map ("task.metadata").
 */
function invalidUtf8(bytes: Uint8Array, reader: BinaryReader, end: number, type: protobuf.Type, path: string, found: { taskId: string }): void {
  eachKnownField(reader, end, type, path, (field, wireType, nameOf, number) => {
    if (wireType !== WireType.LengthDelimited) return void reader.skip(wireType, number);
    const name = nameOf();
    const fieldEnd = reader.uint32() + reader.pos;
    if (field.map) {
      let key: string | undefined;
      while (reader.pos < fieldEnd) {
        const [n, wt] = reader.tag();
        if (n === 1 && wt === WireType.LengthDelimited && field instanceof protobuf.MapField && field.keyType === 'string') {
          const keyEnd = reader.uint32() + reader.pos;
          const keyBytes = bytes.subarray(reader.pos, keyEnd);
          reader.pos = keyEnd;
          if (!isUtf8(keyBytes)) throw new Finding(name, 'a key is not valid UTF-8 (proto3 strings must be)', found.taskId);
          key = new TextDecoder().decode(keyBytes);
        } else if (n === 2 && wt === WireType.LengthDelimited) {
          const valueEnd = reader.uint32() + reader.pos;
          const at = key === undefined ? name : `${name}.${key}`;
          if (field.resolvedType instanceof protobuf.Type) invalidUtf8(bytes, reader, valueEnd, field.resolvedType, at, found);
          else if (field.type === 'string' && !isUtf8(bytes.subarray(reader.pos, valueEnd))) throw new Finding(at, 'not valid UTF-8 (proto3 strings must be)', found.taskId);
          reader.pos = valueEnd;
        } else reader.skip(wt, n);
      }
    } else if (field.resolvedType instanceof protobuf.Type) {
      invalidUtf8(bytes, reader, fieldEnd, field.resolvedType, name, found);
    } else if (field.type === 'string') {
      const value = bytes.subarray(reader.pos, fieldEnd);
      // The task's id is named in the rejection only when it is itself intact.
      const valid = isUtf8(value);
      if (name === 'task.task_id' && valid) found.taskId = new TextDecoder().decode(value);
      if (!valid) throw new Finding(name, 'not valid UTF-8 (proto3 strings must be)', name === 'task.task_id' ? '' : found.taskId);
    }
    reader.pos = fieldEnd;
  });
}

function walk(
  reader: BinaryReader,
  end: number,
  type: protobuf.Type,
  path: string,
  depth: number,
  structField: string | undefined,
  found: { taskId: string },
): void {
  const level = enter(depth, structField ?? path);
  // Inside a Struct every type is transparent, so each field there is named by the Struct's field.
  eachKnownField(reader, end, type, structField ?? path, (field, wireType, nameOf) => {
    const name = nameOf();
    if (field.map) {
      // A map entry is a message { 1: key, 2: value }, and a level of the guard.
      const entryEnd = lengthDelimited(reader, wireType, name, end);
      const entryLevel = enter(level, name);
      while (reader.pos < entryEnd) {
        const [n, wt] = reader.tag();
        if (n === 2) value(reader, wt, field, name, entryEnd, entryLevel, structField, found);
        else reader.skip(wt, n);
      }
      reader.pos = entryEnd;
    } else {
      value(reader, wireType, field, name, end, level, structField, found);
    }
  });
  if (reader.pos > end) throw new Finding(structField ?? path, 'truncated');
}

/** Reads one value of `field` (scalar, message, or a packed run of 64-bit integers). */
function value(
  reader: BinaryReader,
  wireType: WireType,
  field: protobuf.Field,
  name: string,
  end: number,
  level: number,
  structField: string | undefined,
  found: { taskId: string },
): void {
  const type = field.resolvedType;
  if (type instanceof protobuf.Type) {
    const innerEnd = lengthDelimited(reader, wireType, name, end);
    const innerStruct = structField ?? (STRUCT_TYPES.has(type.fullName) ? name : undefined);
    walk(reader, innerEnd, type, name, level, innerStruct, found);
    reader.pos = innerEnd;
  } else if (INT64_TYPES.has(field.type)) {
    const values = wireType === WireType.LengthDelimited ? packed(reader, field.type) : [read64(reader, field.type)];
    for (const v of values) {
      if (v > MAX_SAFE || v < -MAX_SAFE) {
        throw new Finding(name, `must be an integer within ±${Number.MAX_SAFE_INTEGER} (2^53−1) to be honoured exactly, got ${v}`);
      }
    }
  } else if (wireType === WireType.LengthDelimited) {
    // A string, bytes or packed field: a length past the end of its message is that field's fault.
    const start = reader.pos;
    const fieldEnd = lengthDelimited(reader, wireType, name, end);
    if (name === 'task.task_id') {
      reader.pos = start;
      found.taskId = reader.string();
    }
    reader.pos = fieldEnd;
  } else {
    try {
      reader.skip(wireType);
    } catch (err) {
      // A varint or fixed-width value cut off by the end of the bytes (or a group that never ends).
      throw new Finding(name, `truncated (${message(err)})`);
    }
  }
}

/** Counts a level of ts-proto's recursion guard (every message and map entry is one); throws past its limit. */
function enter(depth: number, field: string): number {
  if (depth >= MAX_RECURSION) throw new Finding(field, 'nested too deeply (objects and lists at most about 32 levels deep)');
  return depth + 1;
}

function lengthDelimited(reader: BinaryReader, wireType: WireType, name: string, end: number): number {
  if (wireType !== WireType.LengthDelimited) throw new Finding(name, 'wrong wire type');
  const length = reader.uint32();
  if (reader.pos + length > end) throw new Finding(name, 'truncated');
  return reader.pos + length;
}

function read64(reader: BinaryReader, type: string): bigint {
  switch (type) {
    case 'uint64':
      return BigInt(reader.uint64());
    case 'sint64':
      return BigInt(reader.sint64());
    case 'fixed64':
      return BigInt(reader.fixed64());
    case 'sfixed64':
      return BigInt(reader.sfixed64());
    default:
      return BigInt(reader.int64());
  }
}

function packed(reader: BinaryReader, type: string): bigint[] {
  const end = reader.uint32() + reader.pos;
  const out: bigint[] = [];
  while (reader.pos < end) out.push(read64(reader, type));
  return out;
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
