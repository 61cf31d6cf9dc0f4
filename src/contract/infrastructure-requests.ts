import { BinaryReader, WireType } from '@bufbuild/protobuf/wire';
import { isUtf8 } from 'node:buffer';
import type { Server, ServiceDefinition, UntypedServiceImplementation } from '@grpc/grpc-js';
import protobuf from 'protobufjs';
import { RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import { WIRE_TYPE_NAMES, wireTypeOf } from './decode-diagnosis.js';
import { toServiceError } from './status.js';

/**
 * The services the server hosts from libraries (grpc.health.v1, server reflection) decode their requests with
 * protobufjs, which is lenient where ours are strict and throws where ours answer: a string whose length runs past
 * the end is cut short, a field sent with another wire type is dropped (a garbled Check then asks for "" — the
 * server's overall status — and is answered SERVING), and what it cannot read at all ends the call INTERNAL
 * ("Error deserializing request"). Through this, their requests are checked on the wire first, as tolerantService
 * checks ours, and a bad one is answered INVALID_ARGUMENT naming the field, the call's handler never seeing it.
 */
export function strictRequestsServer(server: Pick<Server, 'addService'>, protoFiles: readonly string[], logger: Logger): Pick<Server, 'addService'> {
  const log = logger.child({ component: 'infrastructure-requests' });
  const root = new protobuf.Root();
  root.loadSync([...protoFiles], { keepCase: true });
  root.resolveAll();
  return {
    addService(service: ServiceDefinition, implementation: UntypedServiceImplementation): void {
      const strictService: Record<string, unknown> = {};
      const strictImplementation: UntypedServiceImplementation = {};
      for (const [name, method] of Object.entries(service)) {
        const [, serviceName, rpc] = method.path.split('/');
        const requestType = root.lookupService(serviceName!).methods[rpc!]!.resolvedRequestType!;
        const decode = method.requestDeserialize;
        strictService[name] = {
          ...method,
          requestDeserialize: (bytes: Buffer): unknown => {
            const problem = wireProblem(bytes, requestType);
            if (problem) return new Refused(problem.field, `not a valid ${requestType.fullName.slice(1)}: ${problem.reason}`);
            try {
              return decode(bytes);
            } catch (err) {
              return new Refused('', `not a valid ${requestType.fullName.slice(1)}: ${err instanceof Error ? err.message : String(err)}`);
            }
          },
        };
        const handler = implementation[name] ?? implementation[method.originalName ?? ''];
        if (handler === undefined) continue;
        strictImplementation[name] = refusing(handler, method.requestStream, method.responseStream, log);
      }
      server.addService(strictService as ServiceDefinition, strictImplementation);
    },
  };
}

/** What the handler's request is replaced with when its bytes are refused. */
class Refused {
  constructor(
    readonly field: string,
    readonly reason: string,
  ) {}

  error(): RolloutError {
    return this.field ? RolloutError.invalid(this.field, this.reason) : new RolloutError('invalid_argument', this.reason);
  }
}

/**
 * `handler` answering a refused request with its INVALID_ARGUMENT: a unary call through its callback, a server stream
 * by its status; a client or bidi stream ends at the first refused message (the library handler never sees it).
 */
function refusing(handler: UntypedServiceImplementation[string], requestStream: boolean, responseStream: boolean, log: Logger): UntypedServiceImplementation[string] {
  if (requestStream) {
    return ((call: NodeJS.EventEmitter & { push(chunk: unknown): boolean }, ...rest: unknown[]) => {
      const push = call.push.bind(call);
      let refused = false;
      call.push = (chunk: unknown): boolean => {
        if (refused) return false;
        if (!(chunk instanceof Refused)) return push(chunk);
        refused = true;
        call.emit('error', toServiceError(chunk.error(), log));
        return false;
      };
      return (handler as (...args: unknown[]) => void)(call, ...rest);
    }) as UntypedServiceImplementation[string];
  }
  return ((call: NodeJS.EventEmitter & { request: unknown }, callback?: (err: unknown) => void) => {
    if (!(call.request instanceof Refused)) return (handler as (...args: unknown[]) => void)(call, callback);
    const status = toServiceError(call.request.error(), log);
    if (responseStream) call.emit('error', status);
    else callback?.(status);
  }) as UntypedServiceImplementation[string];
}

/** Deepest nesting walked (the library requests nest two levels). */
const MAX_DEPTH = 32;

class Malformed extends Error {
  constructor(
    readonly field: string,
    readonly reason: string,
  ) {
    super(reason);
  }
}

/** The first thing in `bytes` that is not a valid `type` on the wire (by field), or undefined when it is valid. */
function wireProblem(bytes: Uint8Array, type: protobuf.Type): { field: string; reason: string } | undefined {
  try {
    walk(bytes, new BinaryReader(bytes), bytes.length, type, '', 0);
    return undefined;
  } catch (err) {
    if (err instanceof Malformed) return { field: err.field, reason: err.field ? `${err.field}: ${err.reason}` : err.reason };
    return { field: '', reason: err instanceof Error ? err.message : String(err) };
  }
}

/**
 * Walks one message: every tag legal, every known field with its own wire type (a repeated scalar may come packed),
 * every length within the message, every string UTF-8, nested messages likewise; unknown fields skipped.
 */
function walk(bytes: Uint8Array, reader: BinaryReader, end: number, type: protobuf.Type, path: string, depth: number): void {
  if (depth > MAX_DEPTH) throw new Malformed(path, `nested more than ${MAX_DEPTH} deep`);
  while (reader.pos < end) {
    const [number, wireType] = reader.tag();
    const field = type.fieldsById[number];
    const name = `${path ? `${path}.` : ''}${field?.name ?? number}`;
    if (wireType === WireType.StartGroup || wireType === WireType.EndGroup) throw new Malformed(name, 'groups are not proto3');
    if (field !== undefined) {
      const expected = field.map ? WireType.LengthDelimited : wireTypeOf(field.type, field.resolvedType);
      const packed = field.repeated && expected !== WireType.LengthDelimited && wireType === WireType.LengthDelimited;
      if (wireType !== expected && !packed) throw new Malformed(name, `wrong wire type: ${WIRE_TYPE_NAMES[expected]} expected, sent as ${WIRE_TYPE_NAMES[wireType]}`);
    }
    if (wireType !== WireType.LengthDelimited) {
      reader.skip(wireType, number);
      if (reader.pos > end) throw new Malformed(name, 'truncated');
      continue;
    }
    const length = reader.uint32();
    const start = reader.pos;
    if (start + length > end) throw new Malformed(name, `its length (${length} bytes) runs past the end of the message`);
    if (field?.resolvedType instanceof protobuf.Type) walk(bytes, reader, start + length, field.resolvedType, name, depth + 1);
    else if (field?.type === 'string' && !isUtf8(bytes.subarray(start, start + length))) throw new Malformed(name, 'not valid UTF-8');
    reader.pos = start + length;
  }
  if (reader.pos > end) throw new Malformed(path, 'truncated');
}
