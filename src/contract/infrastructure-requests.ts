import { BinaryReader, WireType } from '@bufbuild/protobuf/wire';
import { isUtf8 } from 'node:buffer';
import type { Duplex } from 'node:stream';
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
export function strictRequestsServer(
  server: Pick<Server, 'addService'>,
  protoFiles: readonly string[],
  logger: Logger,
  lifetime?: AbortSignal,
  maxOpenStreams = Number.POSITIVE_INFINITY,
): Pick<Server, 'addService'> {
  const log = logger.child({ component: 'infrastructure-requests' });
  const open = { streams: 0 };
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
            if (bytes.length > INFRASTRUCTURE_REQUEST_BYTES) {
              const field = largestField(bytes, requestType);
              return new Refused(field, `not a valid ${requestType.fullName.slice(1)}: ${bytes.length} bytes, over the ${INFRASTRUCTURE_REQUEST_BYTES} these requests may have${field ? ` (the largest field is ${field})` : ''}`);
            }
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
        const refusingBad = refusing(handler, method.requestStream, method.responseStream, log);
        const strict = method.requestStream && method.responseStream ? paced(refusingBad) : refusingBad;
        const ending = method.responseStream && lifetime ? endingWith(strict, lifetime, log) : strict;
        strictImplementation[name] = method.responseStream || method.requestStream ? bounded(ending, open, maxOpenStreams, rpc!, log) : ending;
      }
      server.addService(strictService as ServiceDefinition, strictImplementation);
    },
  };
}

/**
 * The most bytes a health or reflection request may have. They carry names (a service, a file, a symbol: well under
 * 1 KiB), are answered without a token, and the health library quotes an unknown service's name in its status
 * message: a 1 MiB name made a grpc-message trailer over every client's header list limit, the call then left without a
 * status until its deadline, and a Watch held the name as long as its stream stayed open. Refused by field instead.
 */
export const INFRASTRUCTURE_REQUEST_BYTES = 1024;

/** The name of the largest top-level field of `bytes` (as far as they can be read), or '' when there is none. */
function largestField(bytes: Uint8Array, type: protobuf.Type): string {
  const reader = new BinaryReader(bytes);
  let largest = { number: 0, size: -1 };
  try {
    while (reader.pos < bytes.length) {
      const start = reader.pos;
      const [number, wireType] = reader.tag();
      reader.skip(wireType, number);
      if (reader.pos - start > largest.size) largest = { number, size: reader.pos - start };
    }
  } catch {
    // Truncated or garbled past this point: what was read names it.
  }
  return largest.size < 0 ? '' : (type.fieldsById[largest.number]?.name ?? String(largest.number));
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

/**
 * `handler`'s bidi streams read no further request while their answers wait to be sent. @grpc/reflection answers each
 * request with `write` whatever it returns: a client (no token needed) that wrote requests and read nothing had every
 * one read and answered into memory, without bound. Paused, grpc-js stops reading the HTTP/2 stream, whose flow control
 * then holds the client back; reading resumes once the answers drain.
 */
function paced(handler: UntypedServiceImplementation[string]): UntypedServiceImplementation[string] {
  return ((call: Duplex, ...rest: unknown[]) => {
    const write = call.write.bind(call) as (...args: unknown[]) => boolean;
    call.write = ((...args: unknown[]): boolean => {
      const ok = write(...args);
      if (!ok && !call.isPaused()) {
        call.pause();
        call.once('drain', () => call.resume());
      }
      return ok;
    }) as Duplex['write'];
    return (handler as (...args: unknown[]) => void)(call, ...rest);
  }) as unknown as UntypedServiceImplementation[string];
}

/** The events of a server call that end it, whichever way (cancelled by the client, closed, failed, finished). */
const CALL_END_EVENTS = ['cancelled', 'close', 'error', 'finish'] as const;

/**
 * `handler`'s streams counted against `max` open at once, across every streaming method of these services: one more is
 * ended RESOURCE_EXHAUSTED naming the key before the handler sees it. They are answered without a token, and each
 * open one holds an HTTP/2 stream and its handler's state (a health Watch's listener, a reflection stream's buffers):
 * without a bound a client could open 1,024 on each of as many connections as it liked.
 */
function bounded(handler: UntypedServiceImplementation[string], open: { streams: number }, max: number, rpc: string, log: Logger): UntypedServiceImplementation[string] {
  return ((call: NodeJS.EventEmitter, ...rest: unknown[]) => {
    let ended = false;
    let counted = false;
    // However the call ends, once: its place is given back if it had one.
    const onEnd = (): void => {
      if (ended) return;
      ended = true;
      if (counted) open.streams--;
    };
    for (const event of CALL_END_EVENTS) call.once(event, onEnd);
    const admit = (): void => {
      open.streams++;
      counted = true;
      (handler as (...args: unknown[]) => void)(call, ...rest);
    };
    if (open.streams < max) return admit();
    // Decided once what the connection's data brought is handled: a client that cancels a watch and opens another at
    // once sends both in one read, and grpc-js reports the cancel a tick after the new call starts (see call-bounds.ts).
    setImmediate(() => {
      if (ended) return;
      if (open.streams < max) return admit();
      const err = new RolloutError(
        'resource_exhausted',
        `${open.streams} health and reflection streams are open, the most the server allows (calls.maxOpenInfrastructureStreams): close some, or use the unary health Check`,
      );
      log.warn({ rpc, open: open.streams }, 'health/reflection stream refused: too many open');
      call.emit('error', toServiceError(err, log));
    });
  }) as UntypedServiceImplementation[string];
}

/**
 * `handler`'s streams ended with the lifetime signal's reason (UNAVAILABLE) once it fires, as every stream of our own
 * services is: a health Watch (a load balancer keeps one open) or a reflection stream would otherwise stay open through
 * the drain, which then waited out its close bound for them and cut them off without a status.
 */
function endingWith(handler: UntypedServiceImplementation[string], lifetime: AbortSignal, log: Logger): UntypedServiceImplementation[string] {
  return ((call: NodeJS.EventEmitter, ...rest: unknown[]) => {
    let done = false;
    const end = (): void => {
      if (!done) call.emit('error', toServiceError(lifetime.reason, log));
    };
    // However the call ends (a refused request ends it inside the handler): no listener is left on the signal.
    const forget = (): void => {
      done = true;
      lifetime.removeEventListener('abort', end);
    };
    for (const event of CALL_END_EVENTS) call.once(event, forget);
    (handler as (...args: unknown[]) => void)(call, ...rest);
    if (done) return;
    if (lifetime.aborted) end();
    else lifetime.addEventListener('abort', end, { once: true });
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
