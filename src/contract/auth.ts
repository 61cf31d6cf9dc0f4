import { Metadata, ServerInterceptingCall, setLogger, status, type ServerInterceptor } from '@grpc/grpc-js';
import { createHash, timingSafeEqual } from 'node:crypto';
import type { Logger } from '../observability/logger.js';
import { RateLimitedLog, type RateLimitOptions } from '../observability/rate-limited-log.js';

/** Which token each service asks for; services not named here (health, reflection) are open. */
export interface AuthPolicy {
  /** Bearer token of RolloutService (the trainer's side); unset: open. */
  token?: string | undefined;
  /** Bearer token of the admin services (BackendService, AdminService); unset: `token`'s (and open when both are). */
  adminToken?: string | undefined;
}

/** The services each token guards. Health checking and reflection stay open so load balancers and grpcurl work. */
const TRAINER_SERVICES = new Set(['rollout.v1.RolloutService']);
const ADMIN_SERVICES = new Set(['rollout.v1.BackendService', 'rollout.v1.AdminService']);

/**
 * Checks `authorization: Bearer <token>` on every call before its handler runs (unary and streaming alike, so a
 * Rollout stream or a Watch without the token never starts), answering UNAUTHENTICATED otherwise. One server
 * interceptor is the one place this happens: handlers need no check of their own.
 *
 * With a trainer token and no admin token, the admin services take the trainer token: a server that asks a token of
 * its trainers must not leave engines and drains to anyone (and a trainer calls PauseGeneration/ResumeGeneration
 * around weight updates anyway). With an admin token, neither token opens the other's services.
 *
 * The comparison is constant-time: both sides are hashed (SHA-256) first, so neither the token's bytes nor its
 * length leak through timing. Refused calls are logged at warn through a RateLimitedLog (`logRate`), so a client
 * without a token cannot flood the log.
 */
export function authInterceptor(policy: AuthPolicy, logger: Logger, logRate: RateLimitOptions = {}): ServerInterceptor {
  const refusals = new RateLimitedLog(logger.child({ component: 'auth' }), logRate);
  const trainer = policy.token === undefined ? undefined : digest(`Bearer ${policy.token}`);
  const adminToken = policy.adminToken ?? policy.token;
  const admin = adminToken === undefined ? undefined : digest(`Bearer ${adminToken}`);
  const adminWhich = policy.adminToken === undefined ? 'token' : 'admin token';
  return (method, call) => {
    const service = method.path.split('/')[1] ?? '';
    const expected = TRAINER_SERVICES.has(service) ? trainer : ADMIN_SERVICES.has(service) ? admin : undefined;
    if (expected === undefined) return new ServerInterceptingCall(call);
    const which = TRAINER_SERVICES.has(service) ? 'token' : adminWhich;
    return new ServerInterceptingCall(call, {
      start: (next) =>
        next({
          onReceiveMetadata: (metadata, mdNext) => {
            const given = metadata.get('authorization')[0];
            if (typeof given === 'string' && timingSafeEqual(digest(given), expected)) {
              mdNext(metadata);
              return;
            }
            refusals.write('warn', () => ({ method: method.path, peer: call.getPeer(), given: given !== undefined }), 'call refused: missing or wrong bearer token');
            call.sendStatus({
              code: status.UNAUTHENTICATED,
              details: given === undefined ? `${which} required: authorization: Bearer <${which}>` : `wrong ${which}`,
              metadata: new Metadata(),
            });
          },
        }),
    });
  };
}

/**
 * Whether an `authorization` header value is `Bearer <token>`, in constant time: both sides are hashed first, so
 * neither the token's bytes nor its length leak through timing.
 */
export function bearerMatches(given: unknown, token: string): boolean {
  return typeof given === 'string' && timingSafeEqual(digest(given), digest(`Bearer ${token}`));
}

function digest(value: string): Buffer {
  return createHash('sha256').update(value).digest();
}

/**
 * Routes grpc-js's own log (console.error by default) through the server's logger. A client causes its error lines
 * at will: a request header gRPC metadata cannot carry (a non-ASCII byte, a control character) is dropped with a
 * line quoting the header — one stderr line per call, unbounded, and an `authorization` header with a typo'd token
 * is printed whole. Its errors go through a RateLimitedLog, a dropped header named by its key only (the token is
 * then simply missing: UNAUTHENTICATED). Info and debug lines appear only when an operator turns them on
 * (GRPC_VERBOSITY, GRPC_TRACE) and are written at info, unlimited, as asked for. grpc-js has one logger per process:
 * the last server started sets it.
 */
export function routeGrpcLog(logger: Logger, logRate: RateLimitOptions = {}): void {
  const log = logger.child({ component: 'grpc' });
  const errors = new RateLimitedLog(log, logRate);
  const text = (message: unknown, rest: unknown[]): string => [message, ...rest].map(String).join(' ').slice(0, 1_024);
  setLogger({
    error: (message: unknown, ...rest: unknown[]) => {
      const dropped = /^Failed to add metadata entry ([^:]{0,128}):/.exec(String(message));
      if (dropped) errors.write('warn', { header: dropped[1] }, 'dropped a request header gRPC metadata cannot carry (not printable ASCII)');
      else errors.write('error', () => ({ grpc: text(message, rest) }), 'grpc-js error');
    },
    info: (message: unknown, ...rest: unknown[]) => log.info({ grpc: text(message, rest) }, 'grpc-js'),
    debug: (message: unknown, ...rest: unknown[]) => log.info({ grpc: text(message, rest) }, 'grpc-js'),
  });
}
