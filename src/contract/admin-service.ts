import type { Logger } from '../observability/logger.js';
import type { LifecycleState, ServerLifecycle } from '../lifecycle.js';
import { RolloutError } from '../errors.js';
import { type AdminServiceServer, ServerState } from '../../gen/ts/rollout/v1/admin.js';
import { unary } from './unary.js';

export interface AdminServiceDeps {
  lifecycle: ServerLifecycle;
  /** Samples admitted and not finished. */
  inFlight: () => number;
  /** Begins draining (or shortens the grace of a drain under way); does not wait for it to end. */
  drain: (graceMs: number | undefined) => void;
  logger: Logger;
}

const STATE: Readonly<Record<LifecycleState, ServerState>> = {
  starting: ServerState.SERVER_STATE_STARTING,
  running: ServerState.SERVER_STATE_RUNNING,
  draining: ServerState.SERVER_STATE_DRAINING,
  drained: ServerState.SERVER_STATE_DRAINED,
  stopped: ServerState.SERVER_STATE_STOPPED,
  failed: ServerState.SERVER_STATE_FAILED,
};

/** Largest grace a Drain call may ask for: a day (a larger value is a unit mistake). */
const MAX_GRACE_MS = 86_400_000;

/**
 * AdminService: drain the server and ask its lifecycle state. The admin token is checked by the auth interceptor
 * (src/contract/auth.ts) before these handlers run.
 */
export function adminService(deps: AdminServiceDeps): AdminServiceServer {
  const log = deps.logger.child({ component: 'admin-service' });
  return {
    drain: unary(log, (request) => {
      if (request.graceMs !== undefined && request.graceMs > MAX_GRACE_MS) throw RolloutError.invalid('grace_ms', `at most ${MAX_GRACE_MS} (a day), got ${request.graceMs}`);
      log.info({ graceMs: request.graceMs }, 'drain requested');
      deps.drain(request.graceMs);
      return { state: STATE[deps.lifecycle.state], deadlineUnixMs: deps.lifecycle.drainDeadline ?? 0 };
    }),
    getServerState: unary(log, () => ({
      state: STATE[deps.lifecycle.state],
      inFlight: deps.inFlight(),
      drainDeadlineUnixMs: deps.lifecycle.state === 'draining' ? (deps.lifecycle.drainDeadline ?? 0) : 0,
    })),
  };
}
