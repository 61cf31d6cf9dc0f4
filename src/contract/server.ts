import { Server, ServerCredentials } from '@grpc/grpc-js';
import { ReflectionService } from '@grpc/reflection';
import { HealthImplementation } from 'grpc-health-check';
import { fileURLToPath } from 'node:url';
import type { Logger } from '../observability/logger.js';
import type { ServerConfig } from '../config.js';
import type { EnvironmentRegistry } from '../environments/registry.js';
import type { RolloutRuntime } from '../runtime.js';
import { RolloutServiceService } from '../../gen/ts/rollout/v1/rollout.js';
import { BackendServiceService } from '../../gen/ts/rollout/v1/backend.js';
import { backendService } from './backend-service.js';
import { reflectedDefinition } from './reflection.js';
import { rolloutService } from './rollout-service.js';
import { SessionManager } from './sessions.js';
import { tolerantService, transportReceiveLimit } from './tolerant-decode.js';
import { trajectorySerializers } from './response-encode.js';

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
}

export interface RunningServer {
  readonly port: number;
  readonly address: string;
  readonly health: HealthImplementation;
  /** Trainer sessions (their unacked, held and outbox bytes: `sessions.stats()`). */
  readonly sessions: SessionManager;
  /** Stops accepting calls, cancels in-flight work, closes the server. */
  shutdown(): Promise<void>;
}

/**
 * Serves RolloutService, BackendService, grpc.health.v1 and server reflection on host:port (port 0 picks a free
 * one). Message size limits come from the config so oversized requests are refused by the transport.
 */
export async function startGrpcServer(options: GrpcServerOptions): Promise<RunningServer> {
  const { runtime, registry, logger } = options;
  const config = runtime.deps.config;
  const log = logger.child({ component: 'server' });
  const server = new Server({
    'grpc.max_receive_message_length': transportReceiveLimit(config.maxMessageBytes),
    'grpc.max_send_message_length': config.maxMessageBytes,
    ...keepaliveOptions(config.keepalive),
  });
  const sessions = options.sessions ?? new SessionManager(options.sessionTtlMs ?? config.sessions.ttlMs, config.sessions.maxUnackedBytes);
  server.addService(trajectorySerializers(tolerantService(RolloutServiceService, config.maxMessageBytes), config.maxMessageBytes), rolloutService({ runtime, registry, sessions, logger, serverVersion: SERVER_VERSION }));
  server.addService(
    tolerantService(BackendServiceService, config.maxMessageBytes),
    backendService({
      pool: runtime.deps.pool,
      logger,
      ...(config.adminToken !== undefined && { adminToken: config.adminToken }),
      defaultModel: config.model.name,
      requestTimeoutMs: config.backendRequestTimeoutMs,
      maxResponseBytes: config.backendMaxResponseBytes,
    }),
  );
  const health = new HealthImplementation({ '': 'SERVING', 'rollout.v1.RolloutService': 'SERVING', 'rollout.v1.BackendService': 'SERVING' });
  health.addToServer(server);
  new ReflectionService(reflectedDefinition(['rollout/v1/rollout.proto', 'rollout/v1/backend.proto'], PROTO_DIR)).addToServer(server);

  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync(`${config.host}:${config.port}`, ServerCredentials.createInsecure(), (err, boundPort) => (err ? reject(err) : resolve(boundPort))),
  );
  runtime.start();
  log.info({ host: config.host, port }, 'rollout server listening');

  let stopping: Promise<void> | undefined;
  return {
    port,
    address: `${config.host}:${port}`,
    health,
    sessions,
    shutdown: () =>
      (stopping ??= (async () => {
        health.setStatus('', 'NOT_SERVING');
        await runtime.stop();
        sessions.stop();
        await new Promise<void>((resolve) => {
          const timer = setTimeout(() => {
            server.forceShutdown();
            resolve();
          }, 2_000);
          server.tryShutdown(() => {
            clearTimeout(timer);
            resolve();
          });
        });
        log.info('rollout server stopped');
      })()),
  };
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
