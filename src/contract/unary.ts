import type { ServerUnaryCall, sendUnaryData } from '@grpc/grpc-js';
import { RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import { toServiceError } from './status.js';
import { undecodable, undecodableError } from './tolerant-decode.js';
import { setLongTimeout } from '../timers.js';

/**
 * Unary handler adapter: one try/catch, errors through the one status mapping, undecodable requests answered
 * by field, and an AbortSignal that fires when the client cancels or the call's deadline passes — so work a
 * client gave up on (waiting for admission, waiting for trajectories) is dropped instead of outliving the call.
 */
export function unary<Req, Res>(
  log: Logger,
  fn: (request: Req, signal: AbortSignal, call: ServerUnaryCall<Req, Res>) => Promise<Res> | Res,
  /** The server-lifetime signal (ServerLifecycle.signal): a call still waiting when the server stops ends with its reason. */
  lifetime?: AbortSignal,
) {
  return (call: ServerUnaryCall<Req, Res>, callback: sendUnaryData<Res>): void => {
    const { signal, dispose } = callSignal(call, lifetime);
    Promise.resolve()
      .then(() => {
        // A request whose bytes did not decode (see tolerantService): INVALID_ARGUMENT naming the field.
        const bad = undecodable(call.request);
        if (bad) throw undecodableError(bad);
        return fn(call.request, signal, call);
      })
      .then(
        (response) => callback(null, response),
        (err: unknown) => callback(toServiceError(err, log)),
      )
      .finally(dispose);
  };
}

/** How long before a unary call's deadline its answer is made (see callSignal): 5 % of the time left, 50 ms to 1 s. */
export function deadlineMargin(ms: number): number {
  return Math.min(1_000, Math.max(50, ms / 20));
}

/**
 * Fires on client cancel, at the deadline (a little before, so the answer can still reach the client), or when the
 * server stops (with the lifetime signal's reason: UNAVAILABLE).
 */
function callSignal(call: ServerUnaryCall<unknown, unknown>, lifetime: AbortSignal | undefined): { signal: AbortSignal; dispose: () => void } {
  const controller = new AbortController();
  const onCancel = (): void => controller.abort(Object.assign(new Error('client cancelled the call'), { name: 'AbortError' }));
  const onStop = (): void => controller.abort(lifetime?.reason);
  call.on('cancelled', onCancel);
  if (lifetime?.aborted) onStop();
  else lifetime?.addEventListener('abort', onStop, { once: true });
  const deadline = call.getDeadline();
  const ms = deadline instanceof Date ? deadline.getTime() - Date.now() : Number.isFinite(deadline) ? Number(deadline) - Date.now() : Infinity;
  // A long timer: a client may set a deadline further away than a Node timer holds (~24.8 days). Fired ahead of the
  // deadline by 5 % of it (50 ms to 1 s): the answer (what finished so far) must reach the client before its own timer
  // ends the call DEADLINE_EXCEEDED, also when this event loop or the client's is late (50 ms flat lost that race on a
  // busy 2-core machine: call-bounds' GetTrajectory waits).
  const timer = Number.isFinite(ms) ? setLongTimeout(() => controller.abort(Object.assign(new Error('call deadline reached'), { name: 'TimeoutError' })), Math.max(0, ms - deadlineMargin(ms))) : undefined;
  return {
    signal: controller.signal,
    dispose: () => {
      timer?.clear();
      call.off('cancelled', onCancel);
      lifetime?.removeEventListener('abort', onStop);
    },
  };
}

/**
 * A unary call names a field by its path from the request ("task.num_samples" for a SubmitRequest), as its
 * decode failures already do ("task.sampling.seed"); validation that speaks TaskSpec-relative paths (shared with
 * the stream, whose TaskRejected is TaskSpec-relative) is moved below `parent` here, in the trailer and the message.
 */
export function fieldBelow(parent: string, err: unknown): unknown {
  if (!(err instanceof RolloutError) || !err.field) return err;
  const field = `${parent}.${err.field}`;
  const message = err.message.startsWith(`${err.field}: `) ? `${field}: ${err.message.slice(err.field.length + 2)}` : `${field}: ${err.message}`;
  return new RolloutError(err.code, message, { field, cause: err });
}
