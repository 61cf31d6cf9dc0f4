import type { ServerWritableStream } from '@grpc/grpc-js';
import { interval } from 'rxjs';
import type { Logger } from '../observability/logger.js';
import type { RolloutRuntime } from '../runtime.js';
import type { WatchRequest, WatchResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { stageEventOf, stageOf, summaryOf } from './events.js';
import { StreamWriter } from './stream-writer.js';
import { toBackend } from './backend-service.js';
import { watchResponseBytes } from './response-encode.js';
import { toServiceError } from './status.js';
import { undecodable, undecodableError } from './tolerant-decode.js';

/**
 * Encoded bytes a slow watcher may have queued; past it, new messages for it are dropped and counted. In bytes, not
 * messages: 256 full trajectories were up to 256 × 64 MiB. One message larger than this still goes to an empty queue.
 */
const WATCH_QUEUE_BYTES = 4 << 20;
/** The same for watchers of full trajectories, which are large (token arrays). */
const FULL_TRAJECTORY_QUEUE_BYTES = 64 << 20;

/**
 * Read-only tail for dashboards: stage changes, finished-trajectory summaries (or full trajectories) and
 * periodic pool statistics, filtered by environment and group. A slow watcher never slows the pipeline nor grows
 * the server: past a queue limit its messages are dropped and counted in the log.
 */
export async function handleWatch(call: ServerWritableStream<WatchRequest, WatchResponse>, runtime: RolloutRuntime, log: Logger, lifetime?: AbortSignal): Promise<void> {
  const request = call.request;
  const bad = undecodable(request);
  if (bad) {
    call.emit('error', toServiceError(undecodableError(bad), log));
    return;
  }
  const writer = new StreamWriter<WatchResponse>(call, watchResponseBytes);
  const environments = new Set(request.environments);
  const groups = new Set(request.groupIds);
  const wanted = (environment: string, groupId: string): boolean =>
    (environments.size === 0 || environments.has(environment)) && (groups.size === 0 || groups.has(groupId));
  let dropped = 0;
  // Every message kind is bounded: a watcher that stops reading loses messages (counted), the server never buffers
  // without limit for it.
  const limit = request.fullTrajectories ? FULL_TRAJECTORY_QUEUE_BYTES : WATCH_QUEUE_BYTES;
  const send = (message: WatchResponse): void => {
    if (!writer.sendDroppable(message, limit)) dropped++;
  };

  const events = runtime.pipeline.events$.subscribe((event) => {
    const task = event.sample.task;
    if (!wanted(task.environment.name, task.groupId)) return;
    if (event.type === 'stage') {
      if (request.stageEvents) send({ kind: { $case: 'stage', value: stageEventOf(event.sample, event.stage) } });
    } else if (request.fullTrajectories) {
      send({ kind: { $case: 'trajectory', value: event.trajectory } });
    } else {
      send({ kind: { $case: 'finished', value: summaryOf(event.trajectory) } });
    }
  });
  const stats =
    request.statsIntervalMs > 0
      ? interval(Math.max(100, request.statsIntervalMs)).subscribe(() => {
          const backends = runtime.deps.pool.list();
          send({
            kind: {
              $case: 'stats',
              value: {
                unixMs: Date.now(),
                stages: runtime.pipeline.stageStats().map((s) => ({ stage: stageOf(s.stage), concurrency: s.concurrency, active: s.active, queued: s.queued })),
                inFlight: runtime.pipeline.inFlight,
                completedTotal: runtime.pipeline.completedTotal,
                backends: backends.length,
                backendDetails: backends.map(toBackend),
                admitted: runtime.admission.inFlight,
                maxAdmitted: runtime.admission.capacity,
              },
            },
          });
        })
      : undefined;

  // When the server is drained (the lifetime signal), what was queued is flushed and the watch ends UNAVAILABLE.
  const stop = (): void => {
    void writer.flushed().then(() => {
      if (!writer.isClosed) call.emit('error', toServiceError(lifetime?.reason, log));
    });
  };
  if (lifetime?.aborted) stop();
  else lifetime?.addEventListener('abort', stop, { once: true });
  await new Promise<void>((resolve) => {
    call.on('cancelled', resolve);
    call.on('close', resolve);
    call.on('error', resolve);
  });
  lifetime?.removeEventListener('abort', stop);
  events.unsubscribe();
  stats?.unsubscribe();
  if (dropped > 0) log.info({ dropped }, 'watcher was slow: messages dropped');
}
