import { BinaryReader, WireType } from '@bufbuild/protobuf/wire';
import { isUtf8 } from 'node:buffer';
import type { ServiceDefinition } from '@grpc/grpc-js';
import type protobuf from 'protobufjs';
import { RolloutError } from '../errors.js';
import type { WireBound } from '../pipeline/validate-task.js';
import { contractSchema, decodedChecks, diagnoseDecodeFailure, largestField, type DecodeDiagnosis } from './decode-diagnosis.js';

const UNDECODABLE = Symbol('undecodable request');

/** What a handler receives in place of a request whose bytes did not decode. */
interface UndecodableRequest {
  readonly [UNDECODABLE]: DecodeDiagnosis;
}

/**
 * Returns the service definition with request deserializers that never throw. grpc-js ends a call with INTERNAL
 * "Error deserializing request" when a deserializer throws — for a bidi stream that is every other task's
 * delivery gone with one bad message (an int64 seed above 2^53, an instance nested too deep). Instead the bytes
 * are walked to name the offending field, and the handler gets a marker object ({@link undecodable}) to answer
 * by field: a `rejected` on the stream, INVALID_ARGUMENT on a unary call. A request over `maxRequestBytes` is
 * refused the same way, naming its largest field, as long as the transport let it in (see transportReceiveLimit).
 * Bytes that decode but do not mean a request of the contract (no kind set, a string that is not UTF-8: see
 * {@link decodedChecks}) get the same marker, so every RPC answers them by field.
 *
 * `taskBounds` bounds the fields of a task (Rollout's and Submit's) on the wire the same way, before decoding: a 60 MiB
 * instance is refused naming `task.instance` without being turned into objects first (see taskWireBounds).
 *
 * `limits` gives some methods a smaller bound than `maxRequestBytes` (see {@link smallRequestLimits}): grpc-js has
 * one receive limit per server, sized for trajectories and task specs, and no per-method one; this is the earliest
 * place after it where a method is known, and the bytes are not decoded at all when over the method's bound.
 */
export function tolerantService<S extends ServiceDefinition>(service: S, maxRequestBytes: number, limits: RequestLimits = {}, taskBounds?: TaskBounds): S {
  const out: Record<string, unknown> = {};
  for (const [name, method] of Object.entries(service)) {
    const typeName = requestTypeOf(method.path);
    const decode = method.requestDeserialize;
    const check = decodedChecks(typeName);
    const taskCheck = taskBounds && taskFieldCheck(typeName, taskBounds);
    const own = limits[method.path];
    const limit = own === undefined ? maxRequestBytes : Math.min(own, maxRequestBytes);
    out[name] = {
      ...method,
      requestDeserialize: (bytes: Buffer): unknown => {
        if (bytes.length > limit) {
          // Over the request limit but under the transport's (see transportReceiveLimit): refused by field, before
          // anything is decoded.
          const marker: UndecodableRequest = { [UNDECODABLE]: own === undefined ? overLimit(bytes, typeName, limit) : overMethodLimit(bytes, typeName, limit, method.path) };
          return marker;
        }
        const overBound = taskCheck?.(bytes);
        if (overBound) {
          const marker: UndecodableRequest = { [UNDECODABLE]: overBound };
          return marker;
        }
        try {
          const request: unknown = decode(bytes);
          const wrong = check(bytes, request);
          if (!wrong) return request;
          const marker: UndecodableRequest = { [UNDECODABLE]: wrong };
          return marker;
        } catch (err) {
          const marker: UndecodableRequest = { [UNDECODABLE]: diagnoseDecodeFailure(bytes, typeName, err) };
          return marker;
        }
      },
    };
  }
  return out as S;
}

/** Wire bounds of a task's fields by TaskSpec field name (see taskWireBounds). */
export type TaskBounds = Readonly<Record<string, WireBound>>;

/**
 * For a request type holding a TaskSpec in its `task` field (RolloutRequest, SubmitRequest): a check of the task's
 * fields against `bounds` on the raw bytes, before anything is decoded. One pass over the tags of the request and of
 * the task (a field's bytes are skipped by their length, repeated entries and repeated occurrences of the task summed),
 * cut short at the first field over its bound. Bytes it cannot walk are left to the decoder and its diagnosis.
 */
function taskFieldCheck(typeName: string, bounds: TaskBounds): ((bytes: Uint8Array) => DecodeDiagnosis | undefined) | undefined {
  const type = contractSchema().lookupType(typeName);
  const taskField = type.fields.task;
  if (taskField?.resolvedType?.fullName !== '.rollout.v1.TaskSpec') return undefined;
  const spec = contractSchema().lookupType('rollout.v1.TaskSpec');
  const byNumber = new Map<number, WireBound & { name: string }>();
  for (const [name, bound] of Object.entries(bounds)) {
    const field = spec.fields[name];
    if (field) byNumber.set(field.id, { name, ...bound });
  }
  const taskIdNumber = spec.fields.task_id!.id;
  return (bytes) => {
    const totals = new Map<number, number>();
    let taskId = '';
    const reader = new BinaryReader(bytes);
    try {
      while (reader.pos < bytes.length) {
        const [number, wireType] = reader.tag();
        if (number !== taskField.id || wireType !== WireType.LengthDelimited) {
          reader.skip(wireType, number);
          continue;
        }
        const end = reader.uint32() + reader.pos;
        if (end > bytes.length) return undefined;
        while (reader.pos < end) {
          const start = reader.pos;
          const [n, wt] = reader.tag();
          const bound = byNumber.get(n);
          // The rejection names the task when its id is one a client could have meant (short, UTF-8).
          if (n === taskIdNumber && wt === WireType.LengthDelimited) taskId = shortString(bytes, reader.pos, end) ?? taskId;
          reader.skip(wt, n);
          if (!bound) continue;
          const total = (totals.get(n) ?? 0) + (reader.pos - start);
          totals.set(n, total);
          if (total > bound.bytes) return { field: `task.${bound.name}`, reason: bound.reason(total), taskId };
        }
        reader.pos = end;
      }
    } catch {
      // Malformed: the decoder refuses it, and its diagnosis names the field.
    }
    return undefined;
  };
}

/** The string whose length prefix is at `at`: when it ends by `end`, is at most 1024 bytes and valid UTF-8. */
function shortString(bytes: Uint8Array, at: number, end: number): string | undefined {
  const reader = new BinaryReader(bytes.subarray(at, end));
  const length = reader.uint32();
  const start = at + reader.pos;
  if (length > 1024 || start + length > end) return undefined;
  const value = bytes.subarray(start, start + length);
  return isUtf8(value) ? Buffer.from(value).toString('utf8') : undefined;
}

/** Receive bounds by method path ("/rollout.v1.RolloutService/Watch"), below the server's `maxRequestBytes`. */
export type RequestLimits = Readonly<Record<string, number>>;

/** Bound of a Watch request: its filters (at most 2 × 1024 entries of 256 bytes, see watch.ts) fit with room to spare. */
export const WATCH_REQUEST_BYTES = 1 << 20;
/** Bound of the requests that carry a few ids and flags (admin and backend calls, Cancel, GetTrajectory, ...). */
export const SMALL_REQUEST_BYTES = 64 << 10;
/** Methods whose requests carry task specs or acks: bounded by the server's `maxMessageBytes` only. */
const LARGE_REQUESTS = new Set(['/rollout.v1.RolloutService/Rollout', '/rollout.v1.RolloutService/Submit']);

/**
 * The receive bounds of every method of `services` that is small by contract: Watch gets WATCH_REQUEST_BYTES, every
 * other method but Rollout and Submit SMALL_REQUEST_BYTES. A Watch of 60 MiB of group ids is then refused by field
 * in a few milliseconds instead of being decoded into millions of strings on the event loop.
 */
export function smallRequestLimits(...services: ServiceDefinition[]): RequestLimits {
  const limits: Record<string, number> = {};
  for (const service of services) {
    for (const method of Object.values(service)) {
      if (LARGE_REQUESTS.has(method.path)) continue;
      limits[method.path] = method.path === '/rollout.v1.RolloutService/Watch' ? WATCH_REQUEST_BYTES : SMALL_REQUEST_BYTES;
    }
  }
  return limits;
}

/** Over the server's request limit: named by the largest field (one level down, where a task's fields are). */
function overLimit(bytes: Uint8Array, typeName: string, limit: number): DecodeDiagnosis {
  const largest = largestField(bytes, typeName);
  const reason = `the request is ${bytes.length} bytes, over the ${limit}-byte limit (${largest.field || 'its largest field'} is ${largest.bytes} bytes)`;
  return { field: largest.field, reason, taskId: largest.taskId };
}

/**
 * Over a method's own bound: named by the top-level field holding the most bytes, a repeated field's entries summed
 * (what the client can shrink is the whole list, not one entry). One pass over the tags, no strings made, and cut
 * short — this runs on the event loop for a request of up to the transport's limit: it stops at the first field that
 * alone is over the bound, or after 4 × the bound of bytes walked.
 */
function overMethodLimit(bytes: Uint8Array, typeName: string, limit: number, path: string): DecodeDiagnosis {
  const type = contractSchema().lookupType(typeName);
  const largest = largestTopLevelField(bytes, limit, 4 * limit);
  const method = path.slice(path.lastIndexOf('/') + 1);
  let reason = `the request is ${bytes.length} bytes, over the ${limit}-byte limit of ${method}`;
  let field = '';
  if (largest !== undefined) {
    field = type.fieldsById[largest.field]?.name ?? String(largest.field);
    reason += largest.bytes > limit ? ` (${field} alone is over it)` : ` (${field} is ${largest.bytes} bytes)`;
  }
  return { field, reason, taskId: '' };
}

/**
 * The top-level field number with the most bytes on the wire (tags included, a repeated field's entries summed),
 * walking until one field has more than `enough` bytes or `walkAtMost` bytes were walked; stops at the first
 * malformed or group field.
 */
function largestTopLevelField(bytes: Uint8Array, enough: number, walkAtMost: number): { field: number; bytes: number } | undefined {
  const totals = new Map<number, number>();
  let best: { field: number; bytes: number } | undefined;
  const reader = new BinaryReader(bytes);
  const end = Math.min(bytes.length, walkAtMost);
  try {
    while (reader.pos < end) {
      const start = reader.pos;
      const [field, wireType] = reader.tag();
      if (wireType === WireType.StartGroup || wireType === WireType.EndGroup) break;
      reader.skip(wireType, field); // throws past the end of the bytes
      const total = (totals.get(field) ?? 0) + (reader.pos - start);
      totals.set(field, total);
      if (best === undefined || total > best.bytes) best = { field, bytes: total };
      if (total > enough) break;
    }
  } catch {
    // A malformed tail: what was found so far is the answer.
  }
  return best;
}

/** The diagnosis carried by a request that did not decode; undefined for a real request. */
export function undecodable(request: unknown): DecodeDiagnosis | undefined {
  return typeof request === 'object' && request !== null && UNDECODABLE in request ? (request as UndecodableRequest)[UNDECODABLE] : undefined;
}

/** The INVALID_ARGUMENT error for an undecodable unary request, naming the field (e.g. "task.sampling.seed"). */
export function undecodableError(diagnosis: DecodeDiagnosis): RolloutError {
  return diagnosis.field ? RolloutError.invalid(diagnosis.field, diagnosis.reason) : new RolloutError('invalid_argument', diagnosis.reason);
}

/** "/rollout.v1.RolloutService/Submit" → "rollout.v1.SubmitRequest", from the contract's own schema. */
function requestTypeOf(path: string): string {
  const [, serviceName, rpc] = path.split('/');
  const service = contractSchema().lookupService(serviceName!);
  const method = service.methods[rpc!];
  if (!method) throw new Error(`no method ${path} in the contract`);
  method.resolve();
  return (method.resolvedRequestType as protobuf.Type).fullName.slice(1);
}

/**
 * The transport's receive limit for a `maxRequestBytes` request limit: four times as much (at most 1 GiB), so a
 * request somewhat over the limit is refused by field on a live stream. Only one beyond this still ends its
 * stream (RESOURCE_EXHAUSTED, from grpc-js before any handler sees it): a session stays resumable, nothing
 * accepted is lost.
 */
export function transportReceiveLimit(maxRequestBytes: number): number {
  return Math.min(4 * maxRequestBytes, 1 << 30);
}
