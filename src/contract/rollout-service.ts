import { setMaxListeners } from 'node:events';
import type { Writable } from 'node:stream';
import { Metadata, status, type ServerDuplexStream } from '@grpc/grpc-js';
import { clipped, RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import type { EnvironmentRegistry } from '../environments/registry.js';
import type { RolloutRuntime } from '../runtime.js';
import { checkAckSize, type Session } from './session.js';
import type { SessionManager } from './sessions.js';
import { StreamWriter } from './stream-writer.js';
import { grpcCodeOf, MAX_FIELD_CHARS, toServiceError } from './status.js';
import { fieldBelow, unary } from './unary.js';
import { getTrajectoryResponseBytes, rolloutResponseBytes } from './response-encode.js';
import { stageEventOf } from './events.js';
import { handleWatch } from './watch.js';
import { undecodable } from './tolerant-decode.js';
import { linkedController } from '../pipeline/rx.js';
import { checkIdLength } from '../pipeline/validate-task.js';
import {
  type RolloutRequest,
  type RolloutResponse,
  type RolloutServiceServer,
  type TaskSpec,
} from '../../gen/ts/rollout/v1/rollout.js';

export interface RolloutServiceDeps {
  runtime: RolloutRuntime;
  registry: EnvironmentRegistry;
  sessions: SessionManager;
  logger: Logger;
  serverVersion: string;
}

/** The RolloutService handlers: the trainer's stream, the unary equivalents, Watch and ListEnvironments. */
export function rolloutService(deps: RolloutServiceDeps): RolloutServiceServer {
  const { runtime, registry, sessions } = deps;
  const log = deps.logger.child({ component: 'rollout-service' });
  /** The server-lifetime signal: fires once the server is drained; every call here then ends with UNAVAILABLE. */
  const lifetime = runtime.lifecycle.signal;

  return {
    rollout: (call) => void handleRollout(call).catch((err: unknown) => handlerFailed(call, err, 'Rollout')),

    submit: unary(log, async (request, signal) => {
      if (!request.task) throw RolloutError.invalid('task', 'required');
      try {
        return await runtime.submit(request.task, { signal });
      } catch (err) {
        throw fieldBelow('task', err);
      }
    }, lifetime),

    getTrajectory: unary(log, async (request, signal) => {
      checkIdLength('task_id', request.taskId);
      const entry = runtime.store.get(request.taskId);
      if (!entry) throw new RolloutError('not_found', `unknown task_id "${request.taskId}"`);
      const n = entry.task.numSamples;
      if (request.sampleIndex !== undefined && (request.sampleIndex < 0 || request.sampleIndex >= n)) {
        throw RolloutError.invalid('sample_index', `must be in [0, ${n}), got ${request.sampleIndex}`);
      }
      const indices = request.sampleIndex === undefined ? [...Array(n).keys()] : [request.sampleIndex];
      // Waits until done or the call's cancel/deadline; then answers with what has finished (pending says the rest).
      if (request.wait) await runtime.store.waitFor(entry, indices, signal);
      // Sent as the stored bytes, never decoded here (see StoredTrajectory).
      const trajectories = indices.flatMap((i) => entry.trajectories[i]?.trajectory() ?? []);
      const response = { trajectories, pending: indices.length - trajectories.length };
      // Refused here, naming the way out, rather than by grpc-js after encoding it all ("Sent message larger than
      // max"): a group of long trajectories can be more than one message. One sample always fits (wireSafe).
      const limit = runtime.deps.config.maxMessageBytes;
      const bytes = getTrajectoryResponseBytes(response);
      if (bytes > limit) {
        const wayOut = request.sampleIndex === undefined ? `: ask for one sample at a time with sample_index (0 to ${n - 1}); each fits` : '';
        throw new RolloutError(
          'resource_exhausted',
          `the ${trajectories.length} finished trajectories of task "${request.taskId}" are ${bytes} bytes in one response, over the server's ${limit}-byte message limit (maxMessageBytes)${wayOut}`,
        );
      }
      return response;
    }, lifetime),

    cancel: unary(log, (request) => {
      checkIdLength('task_id', request.taskId);
      return { cancelled: runtime.cancel(request.taskId) };
    }),

    watch: (call) => void handleWatch(call, runtime, log, lifetime).catch((err: unknown) => handlerFailed(call, err, 'Watch')),

    listEnvironments: unary(log, () => ({
      environments: registry.list().map((e) => ({ name: e.name, description: e.description, instanceSchema: e.instanceSchema, tools: [...e.tools] })),
    })),
  };

  /**
   * A stream handler that threw past its own error handling (a bug, e.g. in its clean-up): logged and its call ended
   * INTERNAL if it was still open. Never an unhandled rejection: Node ends the process on one, and with it every other
   * trainer's stream and everything not journaled.
   */
  function handlerFailed(call: Writable, err: unknown, method: string): void {
    log.error({ err, method }, 'a stream handler failed; its call is ended');
    if (call.writableEnded) return;
    try {
      call.emit('error', { code: status.INTERNAL, details: 'internal error' });
    } catch {
      call.destroy();
    }
  }

  async function handleRollout(call: ServerDuplexStream<RolloutRequest, RolloutResponse>): Promise<void> {
    // A bound a client must keep that SessionOpened has no field for: advertised in the response headers, which reach
    // the client before any answer (see README, "No message kills a stream").
    call.sendMetadata(rolloutHeaders(runtime.deps.config.sessions.maxAckEntries));
    const writer = new StreamWriter<RolloutResponse>(call, rolloutResponseBytes);
    const { maxOutboxBytes, stalledMs } = runtime.deps.config.sessions;
    const aborted = new AbortController();
    // Each task being submitted on the stream listens to it until answered: as many as the stream has in flight.
    setMaxListeners(0, aborted.signal);
    let session: Session | undefined;
    let clean = false;
    /**
     * This stream's tasks not answered yet, in arrival order. At most one of them waits for admission (the last);
     * the others are admitted and wait for the journal's commit, which those arriving together share.
     */
    const submitting = new Set<Submitting>();
    let last: Submitting | undefined;
    const unsubscribe = runtime.pipeline.events$.subscribe((event) => {
      if (event.type === 'stage' && session?.stageEvents && session.owns(event.sample.task.taskId)) {
        // Advisory: a client that stopped reading misses them rather than growing the outbox.
        writer.sendDroppable({ kind: { $case: 'stage', value: stageEventOf(event.sample, event.stage) } }, maxOutboxBytes);
      }
    });
    // A client that goes away (cancel, broken connection): detach at once so the session can be resumed, and
    // destroy the call so a pending read or idle wait ends.
    let failing = false;
    const gone = (): void => {
      if (failing || aborted.signal.aborted) return;
      log.debug({ sessionId: session?.id }, 'stream cancelled or broken by the client');
      aborted.abort();
      session?.detach(writer);
      call.destroy();
    };
    call.on('cancelled', gone);
    call.on('error', gone);
    // Another stream resumed this session (this one is stale or half-open): end this one with ABORTED so its client,
    // if it is still there, learns why; its queued trajectories stay unacked in the session and go to the new stream.
    const evict = (reason: string): void => {
      if (failing || aborted.signal.aborted) return;
      failing = true;
      aborted.abort();
      log.info({ sessionId: session?.id }, 'session taken over by another stream');
      call.emit('error', toServiceError(new RolloutError('aborted', reason), log));
    };
    // A client that stopped reading (its window stayed shut): its queue is dropped, its session detached and the stream
    // ended, so what it holds is the session's unacked bytes, counted with the detached ones (maxDetachedBytes, ttlMs),
    // not an attached session nothing bounds the number of. Not an 'error' on the call now: the request iterator would
    // destroy the call and the status would never be sent; reading ends instead (below) and the loop throws it. The
    // status waits behind what the transport holds for the client.
    let stalled: RolloutError | undefined;
    if (stalledMs > 0) {
      writer.onStall(stalledMs, () => {
        // Whichever way it ends, a client that still takes nothing has its stream reset after a grace (another
        // stalledMs, at least 10 s): the status waits behind what the transport holds, and the stream with its buffers
        // stayed as long as the connection.
        if (!writer.resetUnlessClosedAfterStall(stalledMs)) log.warn('grpc-js internals changed: a stalled stream keeps its HTTP/2 stream until its client reads or goes (see http2StreamOf)');
        if (failing || aborted.signal.aborted || stalled) return;
        const owed = session?.unackedCount ?? 0;
        const resume = session ? `; resume session "${session.id}" to receive its ${owed} unacked trajectories` : '';
        stalled = new RolloutError('resource_exhausted', `this stream's client took no message for ${stalledMs} ms (sessions.stalledMs): ended${resume}`);
        log.info({ sessionId: session?.id, owed, stalledMs }, 'stream ended: its client took no message');
        session?.detach(writer);
        writer.discard();
        // Not admitted yet: never admitted (their answers would reach no one).
        for (const entry of submitting) if (!entry.isAdmitted) entry.controller.abort(stalled);
        stopReading();
      });
    }
    // The server is drained: the loop below goes on reading (acks are recorded, tasks refused as draining) until
    // every trajectory handed to this stream is written, then reading ends as if the client had half-closed, the loop
    // exits and the call ends with UNAVAILABLE. Not an 'error' on the call: a pending read would destroy it, and the
    // client would see CANCELLED instead of the status. grpc-js has asked for the next message already and pushes what
    // the client sends after that (an ack of the last trajectories): pushed after the end, a message would destroy the
    // call (ERR_STREAM_PUSH_AFTER_EOF), its status lost — so from the end on, pushes of messages are dropped.
    const stopReading = (): void =>
      void writer.flushed().then(() => {
        const push = call.push.bind(call);
        call.push = (chunk: unknown): boolean => (chunk === null ? push(null) : false);
        push(null);
      });
    if (lifetime.aborted) stopReading();
    else lifetime.addEventListener('abort', stopReading, { once: true });
    const openSession = (sessionId: string, resume: boolean, stageEvents: boolean): Session => {
      const s = sessions.open(sessionId, resume, stageEvents);
      const { redelivered, tookOver } = s.attach({ writer, evict }, resume);
      writer.sendUrgent({
        kind: {
          $case: 'opened',
          value: {
            sessionId: s.id,
            redelivered,
            serverVersion: deps.serverVersion,
            maxNumSamples: runtime.deps.config.maxNumSamples,
            // Held ones (finished, waiting for room: delivery paused) arrive on this stream as well.
            pending: s.pending + s.heldCount,
            maxUnackedBytes: s.maxUnackedBytes,
            tookOver,
          },
        },
      });
      return s;
    };
    try {
      // destroyOnReturn: false — the default iterator destroys the stream when the client half-closes, which
      // would close our (still needed) writing side.
      for await (const request of call.iterator({ destroyOnReturn: false }) as AsyncIterable<RolloutRequest>) {
        // A slow reader: no request is handled until the outbox drains (bounded in bytes per stream). Here, not after
        // the answer: a rejection of bad bytes counts too, and a client writing garbage without reading must not
        // grow the outbox by one rejection per request.
        await writer.below(maxOutboxBytes);
        // Ended meanwhile (stalled, taken over, gone): a request read now would be answered to no one.
        if (stalled || aborted.signal.aborted) break;
        const bad = undecodable(request);
        if (bad) {
          // Bytes that did not decode: that one request is rejected by field, the stream and its tasks go on.
          session ??= openSession('', false, false);
          // Bounded: a path may name a Struct key as large as the request.
          const field = clipped(bad.field.replace(/^task\./, ''), MAX_FIELD_CHARS);
          writer.sendUrgent({ kind: { $case: 'rejected', value: { taskId: bad.taskId, field, reason: field ? `${field}: ${bad.reason}` : bad.reason, code: status.INVALID_ARGUMENT } } });
          continue;
        }
        const kind = request.kind;
        // Never without a kind: such bytes are refused by field in the deserializer (decodedChecks).
        if (!kind) continue;
        if (kind.$case === 'open') {
          if (session) {
            // A client bug, not a reason to drop every delivery of the stream: answered, then ignored.
            writer.sendUrgent({ kind: { $case: 'rejected', value: { taskId: '', field: 'open', reason: 'open must be the first request of a stream, once', code: status.INVALID_ARGUMENT } } });
            continue;
          }
          // Ends the stream like any open that fails (unknown, taken): the stream has no session to answer on.
          checkIdLength('open.session_id', kind.value.sessionId);
          session = openSession(kind.value.sessionId, kind.value.resume, kind.value.stageEvents);
          continue;
        }
        session ??= openSession('', false, false);
        if (kind.$case === 'task') {
          // One task may wait for admission while the stream keeps reading, so a cancel or ack right behind it is
          // not stuck; a second task waits until the first is admitted (flow control: the server reads no further).
          // It does not wait for the first one's journal write: tasks in a row share one commit and one fsync.
          if (last) await last.admitted;
          if (stalled || aborted.signal.aborted) break;
          const { controller, dispose } = linkedController(aborted.signal);
          const entry = new Submitting(kind.value.taskId, controller);
          entry.done = submitOnStream(session, kind.value, writer, entry, aborted.signal).finally(() => {
            dispose();
            entry.markAdmitted(); // however it ended: the stream reads on
            submitting.delete(entry);
            if (last === entry) last = undefined;
          });
          submitting.add(entry);
          last = entry;
        } else if (kind.$case === 'cancel') {
          if (!kind.value.taskId) {
            // No task has an empty id: a client bug, answered (a cancel of an unknown id is not: it may have finished).
            writer.sendUrgent({ kind: { $case: 'rejected', value: { taskId: '', field: 'task_id', reason: 'task_id: a cancel must name a task', code: status.INVALID_ARGUMENT } } });
            continue;
          }
          const entry = [...submitting].find((e) => e.taskId === kind.value.taskId);
          if (entry && !entry.isAdmitted) {
            // Still waiting for admission: it never starts (answered as rejected). Unless it is a spec sent again of a
            // task already accepted (a client re-sends the specs it has no answer for when its stream opens): that
            // one is answered `accepted` whatever the abort, so the cancel is applied to the task now if it runs, and
            // again once that answer is sent.
            entry.controller.abort(new RolloutError('cancelled', 'cancelled before it was admitted'));
            entry.cancelRequested = true;
            try {
              runtime.cancel(kind.value.taskId);
            } catch {
              // Not running (yet): the answer above decides.
            }
            continue;
          }
          if (entry) {
            // Admitted, its journal write under way: cancelled as soon as it is accepted (its samples exist then).
            entry.cancelRequested = true;
            continue;
          }
          try {
            runtime.cancel(kind.value.taskId);
          } catch (err) {
            log.debug({ err, taskId: kind.value.taskId }, 'cancel of unknown task');
          }
        } else {
          try {
            checkAckSize(kind.value, runtime.deps.config.sessions.maxAckEntries);
          } catch (err) {
            // Answered by field like any bad request; the stream and its session go on.
            const e = RolloutError.from(err);
            writer.sendUrgent({ kind: { $case: 'rejected', value: { taskId: '', field: e.field ?? '', reason: e.message, code: grpcCodeOf(e) } } });
            continue;
          }
          // The journal records what the session acked: a whole-task ack covers only what was sent (see Session.ack).
          const durable = session.ack(kind.value);
          runtime.deps.journal?.ack(durable, session.id);
        }
      }
      if (stalled) throw stalled;
      if (lifetime.aborted) {
        // The server is drained: every trajectory of this stream's session has been handed to the writer. Let the
        // client take them (bounded: the transport is cut after a while anyway), then end with UNAVAILABLE.
        await writer.flushed();
        throw lifetime.reason;
      }
      // The client half-closed: finish delivering what it asked for, then end the stream. It can send no ack any more:
      // what its session holds back for acks goes regardless of the bound (else the stream would never end).
      // A cancel often looks like this too: Node's HTTP/2 client ends its side (END_STREAM) before it sends RST_STREAM,
      // so the server may release held ones into a stream about to go. Nothing is lost: sent, they stay unacked and come
      // again on a resume (as redelivered instead of pending). A stream already known gone is left alone.
      if (!aborted.signal.aborted) session?.endOfAcks(writer);
      await Promise.all([...submitting].map((e) => e.done));
      if (session) {
        await session.idle();
        await writer.flushed();
        clean = !aborted.signal.aborted && !writer.isClosed;
      }
      writer.end();
    } catch (err) {
      if (!aborted.signal.aborted) {
        // grpc-js sends the status of an 'error' emitted on the call.
        failing = true;
        call.emit('error', toServiceError(err, log));
      }
    } finally {
      lifetime.removeEventListener('abort', stopReading);
      unsubscribe.unsubscribe();
      if (session) {
        session.detach(writer);
        // Closed only when the client holds everything: a stream that ended because the connection dropped can
        // look clean here, so unacked trajectories keep the session resumable until its TTL.
        if (clean && session.unackedCount === 0 && session.heldCount === 0) sessions.close(session);
      }
    }
  }

  async function submitOnStream(
    session: Session,
    spec: TaskSpec,
    writer: StreamWriter<RolloutResponse>,
    entry: Submitting,
    stream: AbortSignal,
  ): Promise<void> {
    const { signal } = entry.controller;
    session.claim(spec.taskId);
    try {
      if (session.deliveryPaused && !session.hasAccepted(spec.taskId)) {
        // Admitting more would grow what the session holds without bound; the client was told (delivery_paused). A
        // spec of a task this session accepted before (re-sent after a resume) adds nothing: it is answered as owed.
        throw new RolloutError(
          'resource_exhausted',
          `delivery to session "${session.id}" is paused: ${session.unackedBytes} bytes of trajectories are unacked (limit ${session.maxUnackedBytes}); ack what you received, then submit again`,
        );
      }
      const { journal } = runtime.deps;
      let resent: number[] | undefined;
      const result = await runtime.submit(spec, {
        sink: session.sink,
        signal,
        session: session.id,
        onAdmitted: () => entry.markAdmitted(),
        // A duplicate this session does not hold (a restarted trainer's new session, a unary task, or one this session
        // acked in full and forgot): it is sent every trajectory of the task from now on, so the journal records that
        // debt before the answer — a resume after a crash is owed them too. The stream reads on meanwhile (those
        // writes share commits, as accepts do). One it holds and had acked in part: those samples are owed again
        // (Session.oweAgain), recorded the same way, and marked in memory before the task's replay reaches the sink.
        onDuplicate: () => {
          if (!session.hasAccepted(spec.taskId)) {
            if (!journal) return undefined;
            entry.markAdmitted();
            return journal.owed(spec.taskId, session.id);
          }
          // Only those the replay can send: a sample acked whose trajectory the journal lacked at recovery (its
          // write failed) has none, and owed again it would never come.
          const stored = runtime.store.get(spec.taskId)?.trajectories;
          const acked = session.ackedSamples(spec.taskId).filter((i) => stored?.[i] !== undefined);
          if (acked.length === 0) return undefined;
          if (!journal) {
            resent = session.oweAgain(spec.taskId, acked);
            return undefined;
          }
          entry.markAdmitted();
          return journal.owed(spec.taskId, session.id).then(() => {
            resent = session.oweAgain(spec.taskId, acked);
          });
        },
      });
      // Checked before `expect`: a task this session accepted before (re-sent after a resume, or twice in a row) is
      // owed already.
      const alreadyOwed = session.hasAccepted(spec.taskId);
      // Not a duplicate (run again: the store had let go of it, no journal held it): what it had acked comes as the
      // run finishes it.
      if (alreadyOwed && !result.duplicate) resent ??= session.oweAgain(spec.taskId, session.ackedSamples(spec.taskId));
      session.expect(result.taskId, result.numSamples);
      writer.sendUrgent({ kind: { $case: 'accepted', value: { ...result, alreadyOwed, resentSampleIndexes: alreadyOwed ? (resent ?? []) : [] } } });
      if (entry.cancelRequested) runtime.cancel(result.taskId);
    } catch (err) {
      session.unclaim(spec.taskId);
      if (stream.aborted || writer.isClosed) return;
      const e = err instanceof RolloutError ? err : RolloutError.from(signal.aborted ? signal.reason : err);
      if (e.code === 'internal') log.error({ err, taskId: spec.taskId }, 'submit failed');
      // Bounded: an environment's validation message may quote the (large) value it refused.
      const reason = e.code === 'internal' ? 'internal error' : clipped(e.message, 4096);
      writer.sendUrgent({ kind: { $case: 'rejected', value: { taskId: spec.taskId, field: clipped(e.field ?? '', MAX_FIELD_CHARS), reason, code: grpcCodeOf(e) } } });
    }
  }
}

/** The Rollout stream's response headers: `rollout-max-ack-entries`, the most task ids and trajectories one Ack may list. */
function rolloutHeaders(maxAckEntries: number): Metadata {
  const headers = new Metadata();
  headers.set('rollout-max-ack-entries', String(maxAckEntries));
  return headers;
}

/** A task of a stream between its arrival and its answer (accepted or rejected). */
class Submitting {
  /** Resolves when the task holds its capacity (or its submit ended): the stream may read its next task. */
  readonly admitted: Promise<void>;
  isAdmitted = false;
  /** A cancel arrived before the answer: applied right after `accepted` is sent, if it is. */
  cancelRequested = false;
  done: Promise<void> = Promise.resolve();
  #resolve!: () => void;

  constructor(
    readonly taskId: string,
    readonly controller: AbortController,
  ) {
    this.admitted = new Promise<void>((resolve) => (this.#resolve = resolve));
  }

  markAdmitted(): void {
    this.isAdmitted = true;
    this.#resolve();
  }
}
