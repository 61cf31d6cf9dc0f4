import { Server, ServerCredentials } from '@grpc/grpc-js';
import { ReflectionService } from '@grpc/reflection';
import { HealthImplementation } from 'grpc-health-check';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { RolloutError } from '../errors.js';
import type { ServerLifecycle } from '../lifecycle.js';
import type { Logger } from '../observability/logger.js';
import type { ServerConfig } from '../config.js';
import type { EnvironmentRegistry } from '../environments/registry.js';
import type { RolloutRuntime } from '../runtime.js';
import { RolloutServiceService } from '../../gen/ts/rollout/v1/rollout.js';
import { BackendServiceService } from '../../gen/ts/rollout/v1/backend.js';
import { AdminServiceService } from '../../gen/ts/rollout/v1/admin.js';
import { adminService } from './admin-service.js';
import { authInterceptor, routeGrpcLog } from './auth.js';
import { callBoundsInterceptor, capLongTimeouts } from './call-bounds.js';
import { limitConnections } from './connection-limit.js';
import { backendService } from './backend-service.js';
import { INFRASTRUCTURE_PROTOS, reflectedDefinition } from './reflection.js';
import type { VocabularyOf } from '../backends/embedded/embedded-vocabulary.js';
import { strictRequestsServer } from './infrastructure-requests.js';
import { rolloutService } from './rollout-service.js';
import { SessionManager } from './sessions.js';
import { smallRequestLimits, tolerantService, transportReceiveLimit } from './tolerant-decode.js';
import { encodedResponsesPassThrough } from './stream-writer.js';
import { trajectorySerializers } from './response-encode.js';
import { setLongTimeout, type LongTimer } from '../timers.js';
import { taskWireBounds } from '../pipeline/validate-task.js';

export const SERVER_VERSION = '0.1.0';
const PROTO_DIR = fileURLToPath(new URL('../../proto/', import.meta.url));

export interface GrpcServerOptions {
  runtime: RolloutRuntime;
  registry: EnvironmentRegistry;
  logger: Logger;
  /** How long a broken stream's session stays resumable. */
  sessionTtlMs?: number;
  /** The sessions (start-up recovery fills them from the journal before the server listens); new when absent. */
  sessions?: SessionManager;
  /** Releases what lives beside the server (engine clients, token threads, sandboxes) once the transport closed. */
  release?: () => Promise<void>;
  /** The model's tokenizer as the embedded engines' vocabulary check needs it (AddBackend of an embedded engine). */
  vocabulary: VocabularyOf;
}

export interface RunningServer {
  readonly port: number;
  readonly address: string;
  readonly health: HealthImplementation;
  /** Trainer sessions (their unacked, held and outbox bytes: `sessions.stats()`). */
  readonly sessions: SessionManager;
  /** The server's lifecycle state (runtime.lifecycle): running until a drain. */
  readonly lifecycle: ServerLifecycle;
  /**
   * Drains (see drainServer) and resolves once stopped. `graceMs` (default: config drainGraceMs) bounds how long the
   * work in flight may take; a second call with a shorter grace brings the cancellation forward.
   */
  drain(options?: { graceMs?: number }): Promise<void>;
  /** Drains with no grace: in-flight work is cancelled at once (delivered as CANCELLED), then the server stops. */
  shutdown(): Promise<void>;
}

/** The services health checking reports on: all of them go NOT_SERVING the moment draining begins. */
const HEALTH_SERVICES = ['', 'rollout.v1.RolloutService', 'rollout.v1.BackendService', 'rollout.v1.AdminService'] as const;
/** How long open calls get, once drained, to take what was written to them and end, before the transport is cut. */
const CLOSE_BOUND_MS = 5_000;

/**
 * Serves RolloutService, BackendService, AdminService, grpc.health.v1 and server reflection on host:port (port 0
 * picks a free one), over TLS when configured (mTLS with a client CA), with bearer tokens checked by one interceptor.
 * Message size limits come from the config so oversized requests are refused by the transport.
 */
export async function startGrpcServer(options: GrpcServerOptions): Promise<RunningServer> {
  const { runtime, registry, logger } = options;
  const { lifecycle } = runtime;
  const config = runtime.deps.config;
  const log = logger.child({ component: 'server' });
  routeGrpcLog(logger);
  const server = new Server({
    'grpc.max_receive_message_length': transportReceiveLimit(config.maxMessageBytes),
    'grpc.max_send_message_length': config.maxMessageBytes,
    ...keepaliveOptions(config.keepalive),
    'grpc.max_concurrent_streams': config.connections.maxConcurrentStreams,
    ...(config.connections.idleTimeoutMs > 0 && { 'grpc.max_connection_idle_ms': config.connections.idleTimeoutMs }),
    // Bounds first: a call refused by auth is answered at once, one that never sends anything is not.
    interceptors: [callBoundsInterceptor(config.calls, config.connections), authInterceptor({ token: config.auth.token, adminToken: config.auth.adminToken ?? config.adminToken }, logger)],
  });
  // Watch and the admin calls carry a few ids and flags: their requests get a small bound of their own (the
  // transport's limit is sized for task specs), checked before anything is decoded.
  const limits = smallRequestLimits(RolloutServiceService, BackendServiceService, AdminServiceService);
  const sessions = options.sessions ?? new SessionManager(options.sessionTtlMs ?? config.sessions.ttlMs, config.sessions.maxUnackedBytes, {}, config.sessions.maxDetachedBytes, config.sessions.maxOpen);
  server.addService(
    // A task's fields are bounded on the wire before it is decoded (a 60 MiB instance is refused undecoded).
    // Watch queues most of its messages already encoded (see watch.ts): those bytes go out as they are.
    encodedResponsesPassThrough(trajectorySerializers(tolerantService(RolloutServiceService, config.maxMessageBytes, limits, taskWireBounds(config.maxInstanceBytes)), config.maxMessageBytes), ['/rollout.v1.RolloutService/Watch']),
    rolloutService({ runtime, registry, sessions, logger, serverVersion: SERVER_VERSION }),
  );
  server.addService(
    tolerantService(BackendServiceService, config.maxMessageBytes, limits),
    backendService({
      pool: runtime.deps.pool,
      logger,
      defaultModel: config.model.name,
      requestTimeoutMs: config.backendRequestTimeoutMs,
      bodyIdleTimeoutMs: config.backendBodyIdleTimeoutMs,
      maxResponseBytes: config.backendMaxResponseBytes,
      lifetime: lifecycle.signal,
      vocabulary: options.vocabulary,
    }),
  );
  server.addService(
    tolerantService(AdminServiceService, config.maxMessageBytes, limits),
    adminService({ lifecycle, logger, inFlight: () => runtime.pipeline.inFlight, drain: (graceMs) => void drain(graceMs).catch(() => undefined) }),
  );
  const health = new HealthImplementation(Object.fromEntries(HEALTH_SERVICES.map((name) => [name, 'SERVING'])));
  // Their requests are checked on the wire as ours are: garbage is INVALID_ARGUMENT, never INTERNAL or a guess.
  // Their streams (a load balancer's health Watch) end with ours once the server is drained.
  const infrastructure = strictRequestsServer(server, INFRASTRUCTURE_PROTOS, logger, lifecycle.signal, config.calls.maxOpenInfrastructureStreams);
  health.addToServer(infrastructure);
  new ReflectionService(reflectedDefinition(['rollout/v1/rollout.proto', 'rollout/v1/backend.proto', 'rollout/v1/admin.proto'], PROTO_DIR)).addToServer(infrastructure);

  let port: number;
  try {
    const credentials = await serverCredentials(config.tls);
    port = await new Promise<number>((resolve, reject) =>
      server.bindAsync(`${config.host}:${config.port}`, credentials, (err, boundPort) => {
        if (err) return reject(bindError(config.host, config.port, err));
        // Before any call can arrive (the first comes on a later turn of the event loop).
        if (!capLongTimeouts(server)) log.warn('grpc-js internals changed: grpc-timeout values over ~24.8 days end calls at once (see capLongTimeouts)');
        if (!limitConnections(server, config.connections, logger.child({ component: 'connections' }))) {
          log.warn('grpc-js internals changed: connections are not capped (connections.maxOpen; see limitConnections)');
        }
        resolve(boundPort);
      }),
    );
  } catch (err) {
    lifecycle.transition('failed');
    sessions.stop();
    server.forceShutdown();
    throw err;
  }
  runtime.start();
  lifecycle.transition('running');
  if (config.auth.token === undefined && config.auth.adminToken === undefined && config.adminToken === undefined) {
    // Open is for local use; on a shared node, 127.0.0.1 is reachable by every user of the machine too.
    log.warn({ host: config.host, port }, 'no tokens: anyone who reaches this address may submit tasks, add or remove engines and drain the server (set auth.token, and auth.adminToken for the admin services)');
  } else if (config.auth.token === undefined) {
    // An admin token alone guards only the admin services: the trainer's side (tasks, their prompts in Watch and
    // GetTrajectory, Cancel of any task) stays open, which a server set up "with a token" should not do silently.
    log.warn({ host: config.host, port }, 'no auth.token: RolloutService is open (anyone who reaches this address may submit and cancel tasks and read trajectories); only the admin services take the admin token');
  }
  log.info({ host: config.host, port, tls: config.tls === undefined ? 'off' : config.tls.requireClientCert ? 'mtls' : 'on' }, 'rollout server listening');

  let draining: Promise<void> | undefined;
  let bringForward: ((deadline: number) => void) | undefined;
  const drain = (graceMs: number = config.drainGraceMs): Promise<void> => {
    const deadline = Date.now() + graceMs;
    if (draining) {
      bringForward?.(deadline);
      return draining;
    }
    draining = drainServer(deadline);
    return draining;
  };

  /**
   * The drain, in the lifecycle's order: draining (admission stops: new tasks and those waiting for admission are
   * refused with UNAVAILABLE "draining"; every health service NOT_SERVING) → the work in flight finishes, or at
   * the deadline is cancelled (delivered as CANCELLED, sandboxes released) → drained (every trajectory was handed
   * to its sessions; the lifetime signal makes every open call flush and end with UNAVAILABLE) → the transport
   * closes → engine clients, token threads and sandboxes are released → stopped.
   */
  async function drainServer(deadline: number): Promise<void> {
    const grace = new AbortController();
    let timer: LongTimer | undefined; // a long one: server.drain({ graceMs }) takes any grace
    const schedule = (at: number): void => {
      if (lifecycle.drainDeadline !== undefined && at >= lifecycle.drainDeadline) return;
      lifecycle.drainDeadline = at;
      timer?.clear();
      timer = setLongTimeout(() => grace.abort(), Math.max(0, at - Date.now()), { unref: false });
    };
    try {
      schedule(deadline);
      bringForward = schedule;
      lifecycle.transition('draining');
      for (const name of HEALTH_SERVICES) health.setStatus(name, 'NOT_SERVING');
      log.info({ inFlight: runtime.pipeline.inFlight, graceMs: Math.max(0, deadline - Date.now()) }, 'draining: admission stopped');
      await runtime.idle(grace.signal);
      timer?.clear();
      const cancelled = runtime.pipeline.inFlight;
      if (cancelled > 0) log.warn({ cancelled }, 'drain grace period ended: cancelling the work in flight');
      await runtime.stop("the server's drain grace period ended before this sample finished");
      lifecycle.transition('drained');
      log.info({ cancelled }, 'drained: closing open calls');
      sessions.stop();
      await closeTransport(server);
      await options.release?.();
      lifecycle.transition('stopped');
      log.info('rollout server stopped');
    } catch (err) {
      timer?.clear();
      log.error({ err }, 'drain failed');
      if (lifecycle.state !== 'failed') lifecycle.transition('failed');
      server.forceShutdown();
      throw err;
    }
  }

  return {
    port,
    address: `${config.host}:${port}`,
    health,
    sessions,
    lifecycle,
    drain: (o = {}) => drain(o.graceMs),
    shutdown: () => drain(0),
  };
}

/** Waits for the open calls to end (the lifetime signal has told them to), cutting the rest after CLOSE_BOUND_MS. */
async function closeTransport(server: Server): Promise<void> {
  await new Promise<void>((resolve) => {
    const timer = setTimeout(() => {
      server.forceShutdown();
      resolve();
    }, CLOSE_BOUND_MS);
    server.tryShutdown(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/**
 * A failed bind as a one-line error for the operator: "cannot listen on 127.0.0.1:50051: EADDRINUSE" (grpc-js
 * says "No address added out of total 1 resolved" and puts the cause after it).
 */
function bindError(host: string, port: number, err: Error): RolloutError {
  const code = /\b(E[A-Z]{3,})\b/.exec(err.message)?.[1];
  const detail = code ?? err.message.split('\n')[0];
  return new RolloutError('unavailable', `cannot listen on ${host}:${port}: ${detail}${code === 'EADDRINUSE' ? ' (the port is in use)' : ''}`, { cause: err });
}

/** Plaintext, or TLS from the configured PEM files (verifying client certificates against clientCaFile when set). */
async function serverCredentials(tls: ServerConfig['tls']): Promise<ServerCredentials> {
  if (tls === undefined) return ServerCredentials.createInsecure();
  const read = async (file: string, field: string): Promise<Buffer> => {
    try {
      return await readFile(file);
    } catch (err) {
      throw new RolloutError('invalid_argument', `tls.${field}: cannot read ${file}: ${err instanceof Error ? err.message : String(err)}`, { field: `tls.${field}`, cause: err });
    }
  };
  const [cert, key, clientCa] = await Promise.all([read(tls.certFile, 'certFile'), read(tls.keyFile, 'keyFile'), tls.clientCaFile === undefined ? null : read(tls.clientCaFile, 'clientCaFile')]);
  return ServerCredentials.createSsl(clientCa, [{ cert_chain: cert, private_key: key }], tls.requireClientCert);
}

/**
 * grpc-js server keepalive: the server pings each connection every `timeMs` and destroys it when the answer does
 * not come within `timeoutMs`. A trainer whose node vanished without a FIN (power loss, a NAT that forgot the flow)
 * leaves a half-open connection that would otherwise keep its session attached and its outbox filling forever;
 * with these, its streams end within about timeMs + timeoutMs and the session becomes resumable. (grpc-js does not
 * police client pings: clients may keep their own keepalive at any interval.) timeMs 0 turns pings off.
 */
export function keepaliveOptions(keepalive: ServerConfig['keepalive']): Record<string, number> {
  return keepalive.timeMs > 0 ? { 'grpc.keepalive_time_ms': keepalive.timeMs, 'grpc.keepalive_timeout_ms': keepalive.timeoutMs } : {};
}
