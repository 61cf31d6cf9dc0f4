import type { ServiceDefinition } from '@grpc/grpc-js';
import type protobuf from 'protobufjs';
import { RolloutError } from '../errors.js';
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
 */
export function tolerantService<S extends ServiceDefinition>(service: S, maxRequestBytes: number): S {
  const out: Record<string, unknown> = {};
  for (const [name, method] of Object.entries(service)) {
    const typeName = requestTypeOf(method.path);
    const decode = method.requestDeserialize;
    const check = decodedChecks(typeName);
    out[name] = {
      ...method,
      requestDeserialize: (bytes: Buffer): unknown => {
        if (bytes.length > maxRequestBytes) {
          // Over the request limit but under the transport's (see transportReceiveLimit): refused by field.
          const largest = largestField(bytes, typeName);
          const reason = `the request is ${bytes.length} bytes, over the ${maxRequestBytes}-byte limit (${largest.field || 'its largest field'} is ${largest.bytes} bytes)`;
          const marker: UndecodableRequest = { [UNDECODABLE]: { field: largest.field, reason, taskId: largest.taskId } };
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
