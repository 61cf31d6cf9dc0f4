import type { ServiceDefinition } from '@grpc/grpc-js';
import type protobuf from 'protobufjs';
import { RolloutError } from '../errors.js';
import { contractSchema, diagnoseDecodeFailure, type DecodeDiagnosis } from './decode-diagnosis.js';

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
 * by field: a `rejected` on the stream, INVALID_ARGUMENT on a unary call.
 */
export function tolerantService<S extends ServiceDefinition>(service: S): S {
  const out: Record<string, unknown> = {};
  for (const [name, method] of Object.entries(service)) {
    const typeName = requestTypeOf(method.path);
    const decode = method.requestDeserialize;
    out[name] = {
      ...method,
      requestDeserialize: (bytes: Buffer): unknown => {
        try {
          return decode(bytes);
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
