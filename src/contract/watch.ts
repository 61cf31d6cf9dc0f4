import type { ServerWritableStream } from '@grpc/grpc-js';
import { interval } from 'rxjs';
import { RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import type { PipelineEvent } from '../pipeline/pipeline.js';
import type { RolloutRuntime } from '../runtime.js';
import { WatchResponse, type WatchRequest } from '../../gen/ts/rollout/v1/rollout.js';
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
/** Entries one filter (environments, group_ids) may list: a dashboard names a few; the filter is kept as a Set. */
export const MAX_WATCH_FILTER_ENTRIES = 1024;
/** Bytes of UTF-8 one filter entry may have (environment names and group ids are short). */
export const MAX_WATCH_FILTER_ENTRY_BYTES = 256;

/** Open watches per server (runtime): each may hold its queue bound, so their number is bounded too. */
const openWatches = new WeakMap<RolloutRuntime, number>();

/**
 * The message of a stage or finished event, encoded once for every watcher that sends it (they share these bytes;
 * each queue holds its own copy, packed: see StreamWriter.sendEncodedDroppable).
 */
const encodedEvents = new WeakMap<PipelineEvent, Uint8Array>();

function encodedEvent(event: PipelineEvent): Uint8Array {
  let bytes = encodedEvents.get(event);
  if (bytes === undefined) {
    const message: WatchResponse =
      event.type === 'stage' ? { kind: { $case: 'stage', value: stageEventOf(event.sample, event.stage) } } : { kind: { $case: 'finished', value: summaryOf(event.trajectory) } };
    bytes = WatchResponse.encode(message).finish();
    encodedEvents.set(event, bytes);
  }
  return bytes;
}

/**
 * A filter of the request as a Set, or INVALID_ARGUMENT naming the field when it is too long or has too long an
 * entry: the Set lives as long as the watch, and building it runs on the event loop.
 */
export function watchFilter(values: readonly string[], field: 'environments' | 'group_ids'): Set<string> {
  if (values.length > MAX_WATCH_FILTER_ENTRIES) throw RolloutError.invalid(field, `at most ${MAX_WATCH_FILTER_ENTRIES} entries, got ${values.length}`);
  for (const [i, value] of values.entries()) {
    // UTF-8 is at most 3 bytes per UTF-16 unit: only a long-looking entry is measured.
    if (value.length * 3 > MAX_WATCH_FILTER_ENTRY_BYTES && Buffer.byteLength(value) > MAX_WATCH_FILTER_ENTRY_BYTES) {
      throw RolloutError.invalid(field, `entry ${i} is over ${MAX_WATCH_FILTER_ENTRY_BYTES} bytes`);
    }
  }
  return new Set(values);
}

/**
 * Read-only tail for dashboards: stage changes, finished-trajectory summaries (or full trajectories) and
 * periodic pool statistics, filtered by environment and group. A slow watcher never slows the pipeline nor grows
 * the server: past a queue limit its messages are dropped and counted in the log. Queued messages other than full
 * trajectories are held encoded, so the queue's byte bound is what it holds; full trajectories are the pipeline's
 * own objects (shared with sessions and the task store), counted at their encoded size. At most
 * `watch.maxOpen` watches are open at once (RESOURCE_EXHAUSTED past it); filters are bounded (INVALID_ARGUMENT).
 */
export async function handleWatch(call: ServerWritableStream<WatchRequest, WatchResponse>, runtime: RolloutRuntime, log: Logger, lifetime?: AbortSignal): Promise<void> {
  const request = call.request;
  let environments: Set<string>;
  let groups: Set<string>;
  try {
    const bad = undecodable(request);
    if (bad) throw undecodableError(bad);
    environments = watchFilter(request.environments, 'environments');
    groups = watchFilter(request.groupIds, 'group_ids');
  } catch (err) {
    call.emit('error', toServiceError(err, log));
    return;
  }
  const maxOpen = runtime.deps.config.watch.maxOpen;
  const open = openWatches.get(runtime) ?? 0;
  if (open >= maxOpen) {
    call.emit('error', toServiceError(new RolloutError('resource_exhausted', `${open} watches are open, the server's limit (watch.maxOpen ${maxOpen}): close one or raise it`), log));
    return;
  }
  openWatches.set(runtime, open + 1);
  try {
    await watch(call, runtime, log, environments, groups, lifetime);
  } finally {
    openWatches.set(runtime, (openWatches.get(runtime) ?? 1) - 1);
  }
}

async function watch(
  call: ServerWritableStream<WatchRequest, WatchResponse>,
  runtime: RolloutRuntime,
  log: Logger,
  environments: Set<string>,
  groups: Set<string>,
  lifetime: AbortSignal | undefined,
): Promise<void> {
  const request = call.request;
  const writer = new StreamWriter<WatchResponse>(call, watchResponseBytes);
  const { stalledMs } = runtime.deps.config.watch;
  if (stalledMs > 0) {
    // Dropping its messages bounds its queue, not its slot: a client that stopped reading is ended (the status waits
    // behind what the transport holds for it; the slot is given up at once). A client that still takes nothing has its
    // stream reset after a grace (another stalledMs, at least 10 s): else each ended watch kept its HTTP/2 stream and
    // buffers, so a client opening watches and never reading held ever more of them on one connection.
    writer.onStall(stalledMs, () => {
      if (!writer.resetUnlessClosedAfterStall(stalledMs)) log.warn('grpc-js internals changed: a stalled watch keeps its HTTP/2 stream until its client reads or goes (see http2StreamOf)');
      call.emit('error', toServiceError(new RolloutError('resource_exhausted', `this watch's client took no message for ${stalledMs} ms (watch.stalledMs): ended to free its slot`), log));
    });
  }
  const wanted = (environment: string, groupId: string): boolean =>
    (environments.size === 0 || environments.has(environment)) && (groups.size === 0 || groups.has(groupId));
  let dropped = 0;
  // Every message kind is bounded: a watcher that stops reading loses messages (counted), the server never buffers
  // without limit for it.
  const limit = request.fullTrajectories ? FULL_TRAJECTORY_QUEUE_BYTES : WATCH_QUEUE_BYTES;
  /** Queues a message as its bytes (encoded now, once); full trajectories are queued as the objects they are. */
  const send = (message: WatchResponse | Uint8Array): void => {
    const queued = message instanceof Uint8Array ? writer.sendEncodedDroppable(message, limit) : writer.sendDroppable(message, limit);
    if (!queued) dropped++;
  };

  const events = runtime.pipeline.events$.subscribe((event) => {
    const task = event.sample.task;
    if (!wanted(task.environment.name, task.groupId)) return;
    if (event.type === 'stage') {
      if (request.stageEvents) send(encodedEvent(event));
    } else if (request.fullTrajectories) {
      send({ kind: { $case: 'trajectory', value: event.trajectory } });
    } else {
      send(encodedEvent(event));
    }
  });
  const stats =
    request.statsIntervalMs > 0
      ? interval(Math.max(100, request.statsIntervalMs)).subscribe(() => {
          const backends = runtime.deps.pool.list();
          send(WatchResponse.encode({
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
          }).finish());
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
