import { credentials, InterceptingCall, Metadata, status, type ClientDuplexStream, type Interceptor, type ServiceError } from '@grpc/grpc-js';
import {
  RolloutRequest,
  RolloutServiceClient,
  RolloutServiceService,
  TaskSpec,
  type DeliveryPaused,
  type GetTrajectoryResponse,
  type ListEnvironmentsResponse,
  type RolloutResponse,
  type SessionOpened,
  type TaskAccepted,
  type Trajectory,
  type WatchRequest,
  type WatchResponse,
} from '../../gen/ts/rollout/v1/rollout.js';
import { BackendServiceClient, type AddBackendRequest, type Backend, type PauseMode } from '../../gen/ts/rollout/v1/backend.js';
import { tokenProblem } from '../bearer-token.js';
import { hasLoneSurrogate } from '../errors.js';
import { AsyncQueue } from './async-queue.js';
import { DEFAULT_MAX_ACK_ENTRIES, maxAckEntriesOf } from './ack-limit.js';
import { RetrySchedule, retryBudgetOf } from './refusal-retry.js';
import { MAX_TIMER_MS } from '../timers.js';

/** A task spec as a caller writes it: only task_id, environment, instance and num_samples are needed. */
export type TaskInput = Partial<TaskSpec> & Pick<TaskSpec, 'taskId' | 'environment'> & { instance: Record<string, unknown> };

/** The server rejected a task; `field` names what to fix. */
export class TaskRejectedError extends Error {
  constructor(
    readonly taskId: string,
    readonly field: string,
    readonly reason: string,
    /** The refusal's gRPC status code (TaskRejected.code; 0 from an older server, or a spec refused by this client). */
    readonly code = 0,
  ) {
    super(`task ${taskId} rejected: ${reason}`);
    this.name = 'TaskRejectedError';
  }

  /**
   * Whether the refusal is temporary (RESOURCE_EXHAUSTED: the session's delivery is paused or the server is full;
   * UNAVAILABLE: draining, an outage): the same spec may be submitted again later. Anything else needs the spec fixed.
   */
  get retryable(): boolean {
    return this.code === status.RESOURCE_EXHAUSTED || this.code === status.UNAVAILABLE;
  }
}

export interface SessionOptions {
  sessionId?: string;
  resume?: boolean;
  stageEvents?: boolean;
  /**
   * Trajectories buffered before the client stops reading (gRPC flow control reaches the server), unless a submit
   * waits for its answer (which comes on the same call): the server's sessions.maxUnackedBytes bounds the rest.
   */
  highWater?: number;
  /**
   * Ack each trajectory once the consumer has taken it from the iterator (default true). With false, the caller
   * acks (`ack`) when its trajectories are safe (e.g. after the training step): iteration still ends once everything
   * was received, and the stream stays open until every received trajectory is acked, so acks sent after the loop
   * reach the server.
   */
  autoAck?: boolean;
  /**
   * How long (ms) a task the server refuses for now ({@link TaskRejectedError.retryable}: RESOURCE_EXHAUSTED - the
   * session's delivery is paused, the journal is full - or UNAVAILABLE - starting, draining, an outage) is submitted
   * again on this stream, with backoff (50 ms doubling to 2 s), before `submit()` rejects with the refusal. Default
   * 60 000, the Python client's `retry_rejected_for` (60 s); 0: a refusal rejects at once. A permanent refusal
   * (INVALID_ARGUMENT and the rest) rejects at once whatever this says. The task never runs twice: the spec is sent
   * again only after the server refused it (it did not run), `cancel()` ends the wait (the submit rejects with the
   * refusal), and a stream that ends meanwhile (`abort()`, a drain, a broken connection, a loop left early) rejects
   * the waiting submit with its refusal (or with the stream's error when the spec was on its way again, as any submit
   * awaiting its answer), so the caller may submit it on another session (the same task id: the server answers a task
   * it already took as owed, not run again). A session is one stream: a refusal while the server drains ends as the
   * drained server ends the stream. `close()` does not end the wait: a submit made before it still completes.
   *
   * Paused delivery: with `autoAck`, a submit refused because delivery is paused (the session's unacked trajectories
   * reached the server's `sessions.maxUnackedBytes`) has the client ack every trajectory it has received and not
   * acked yet (queued, not consumed), and those that arrive while the submit waits, before they are consumed: the
   * caller awaits submit() and cannot consume what keeps the pause (a batch submitted before it is read), so without
   * this it would wait out the whole budget. As in the Python client ("consumed" mode): counted in
   * `stats.ackedEarly`; those trajectories are lost if the process dies before they are consumed (a resumed session
   * does not get them again), and they wait in this session's queue until consumed: what bounds that queue is then
   * what the caller submitted without reading (this client has no Python `max_in_flight`). Keep maxUnackedBytes above
   * what a batch holds and nothing is acked early. With
   * `autoAck: false` (the Python "manual" mode) nothing is acked early: the submit waits for the caller's `ack()`.
   */
  retryRejectedForMs?: number;
}

/** One submit until the server answers it, or until a retry after a temporary refusal is due. */
interface Submission {
  readonly taskId: string;
  readonly bytes: Uint8Array;
  readonly resolve: (a: TaskAccepted) => void;
  readonly reject: (e: Error) => void;
  /** Made on its first temporary refusal. */
  schedule?: RetrySchedule;
  /** The last temporary refusal: what the submit rejects with if it is not sent again. */
  refusal?: TaskRejectedError;
  timer?: NodeJS.Timeout;
  /** cancel() named its task: a later refusal is final. */
  cancelled: boolean;
  /** Refused because delivery to the session was paused (see retryRejectedForMs): counted in `waitingOnPause`. */
  refusedByPause: boolean;
}

/**
 * One Rollout stream: submit tasks, iterate trajectories as they finish (completion order). Call `close()`
 * after the last submit; iteration ends once the server has delivered every trajectory of the session.
 *
 * @example
 * const session = client.openSession();
 * await session.submit({ taskId: 't1', environment: 'math', numSamples: 4, instance: { problem: '1+1?', answer: '2' } });
 * session.close();
 * for await (const t of session.trajectories()) console.log(t.sampleIndex, t.reward);
 */
export class RolloutSession {
  readonly opened: Promise<SessionOpened>;
  /** Takes requests, or a request's bytes already encoded (a task, encoded once in submit()). */
  private readonly call: ClientDuplexStream<RolloutRequest | Uint8Array, RolloutResponse>;
  private readonly queue: AsyncQueue<Trajectory>;
  private readonly autoAck: boolean;
  /** The most entries the server takes in one Ack, from the stream's response headers: larger acks go in parts. */
  private maxAckEntries = DEFAULT_MAX_ACK_ENTRIES;
  private ended = false;
  private closing = false;
  private halfClosed = false;
  /**
   * Tasks accepted on this stream with samples still to come, and the sample indices received so far: counted once
   * per task, forgotten when complete (a week-long stream keeps only what is open; the server says `already_owed`
   * for a task re-sent later).
   */
  private readonly openTasks = new Map<string, { numSamples: number; got: Set<number> }>();
  private expected = 0;
  /** Trajectories a resumed session owes us from before this stream. */
  private inherited = 0;
  private isOpen = false;
  /** Distinct trajectories received (a sample of an open task counted once). */
  private received = 0;
  private consumed = 0;
  /** With autoAck off: trajectories received and not acked yet (task, sample), which keep the stream open. */
  private readonly unacked = new Set<string>();
  /** With autoAck: trajectories consumed in this turn of the event loop, acked together (one Ack, not one each). */
  private consumedRefs: { taskId: string; sampleIndex: number }[] = [];
  /** The trajectory queue is at its high-water mark (see {@link flow}), and whether the call's reading is paused. */
  private full = false;
  private paused = false;
  private ackSoon: NodeJS.Immediate | undefined;
  /** Why the stream ended, once it has: a submit after that fails at once with it. */
  private endedWith: Error | undefined;
  /** Submits sent and not answered yet, per task id in the order they were sent (the order of their answers). */
  private readonly pending = new Map<string, Submission[]>();
  /** Submits refused for now, waiting for their retry (see {@link SessionOptions.retryRejectedForMs}). */
  private readonly retrying = new Set<Submission>();
  private readonly retryRejectedForMs: number;
  /** The server holds delivery to this session for acks (its last DeliveryPaused notice was not `resumed`). */
  private deliveryHeld = false;
  /** Submits refused because delivery was paused and not settled yet: while any waits, arrivals are acked early. */
  private waitingOnPause = 0;
  /** With autoAck: trajectories received and not acked yet (queued, being consumed), by refKey. */
  private readonly heldHere = new Map<string, { taskId: string; sampleIndex: number }>();
  /**
   * `rejectionsRetried`: temporary refusals submitted again; `ackedEarly`: trajectories acked before they were consumed
   * because a submit waited on paused delivery (see {@link SessionOptions.retryRejectedForMs}).
   */
  readonly stats = { rejectionsRetried: 0, ackedEarly: 0 };
  /**
   * The server paused delivery (this session's unacked trajectories reached its byte bound; ack to resume) or
   * resumed it (`resumed`). Nothing is dropped meanwhile.
   */
  onDeliveryPaused: ((notice: DeliveryPaused) => void) | undefined;
  /** Stage events, when the session asked for them. */
  onStage: ((event: NonNullable<Extract<RolloutResponse['kind'], { $case: 'stage' }>>['value']) => void) | undefined;

  constructor(client: RolloutServiceClient, options: SessionOptions = {}) {
    // The generated rollout() would encode each request again; submit() has encoded its task already (to refuse an
    // unencodable one alone), so the stream takes those bytes as they are.
    // Checked before the call is opened: a session refused here leaves no stream behind.
    this.retryRejectedForMs = retryBudgetOf(options.retryRejectedForMs);
    const method = RolloutServiceService.rollout;
    this.call = client.makeBidiStreamRequest(method.path, encodeRequest, method.responseDeserialize);
    this.autoAck = options.autoAck ?? true;
    this.queue = new AsyncQueue<Trajectory>(
      options.highWater ?? 1024,
      () => this.flow(true),
      () => this.flow(false),
    );
    let opened!: (s: SessionOpened) => void;
    let failed!: (e: Error) => void;
    this.opened = new Promise((resolve, reject) => {
      opened = resolve;
      failed = reject;
    });
    this.opened.catch(() => undefined);
    // Sent before any answer, so known before the first trajectory arrives (and with it anything to ack).
    this.call.on('metadata', (headers: Metadata) => (this.maxAckEntries = maxAckEntriesOf(headers)));
    this.call.on('data', (response: RolloutResponse) => {
      const kind = response.kind;
      if (!kind) return;
      switch (kind.$case) {
        case 'opened':
          // A resumed session's earlier tasks deliver here too: what was re-sent plus what is still running.
          this.inherited = kind.value.redelivered + kind.value.pending;
          this.isOpen = true;
          opened(kind.value);
          this.maybeHalfClose();
          break;
        case 'accepted':
          // A task re-sent after a resume that the session had accepted before is counted in `inherited` already,
          // except the samples it had acked: those are sent again (resent_sample_indexes) and counted as they come.
          if (!this.openTasks.has(kind.value.taskId) && !kind.value.alreadyOwed) {
            this.openTasks.set(kind.value.taskId, { numSamples: kind.value.numSamples, got: new Set() });
            this.expected += kind.value.numSamples;
          } else if (kind.value.alreadyOwed && kind.value.resentSampleIndexes.length > 0) {
            this.inherited += kind.value.resentSampleIndexes.length;
            const open = this.openTasks.get(kind.value.taskId);
            for (const i of kind.value.resentSampleIndexes) open?.got.delete(i);
          }
          this.settle(kind.value.taskId, (p) => p.resolve(kind.value));
          this.maybeHalfClose();
          break;
        case 'rejected': {
          const refusal = new TaskRejectedError(kind.value.taskId, kind.value.field, kind.value.reason, kind.value.code);
          this.settle(kind.value.taskId, (p) => p.reject(refusal), (p) => this.retryLater(p, refusal));
          this.maybeHalfClose();
          break;
        }
        case 'stage':
          this.onStage?.(kind.value);
          break;
        case 'deliveryPaused':
          this.deliveryHeld = !kind.value.resumed;
          // A submit waits on the pause (refused, to be sent again): what keeps it must be acked (retryRejectedForMs).
          if (this.deliveryHeld && this.waitingOnPause > 0) this.ackEarly();
          this.onDeliveryPaused?.(kind.value);
          break;
        case 'trajectory': {
          this.count(kind.value);
          const ref = { taskId: kind.value.taskId, sampleIndex: kind.value.sampleIndex };
          if (!this.autoAck) this.unacked.add(refKey(ref.taskId, ref.sampleIndex));
          else if (this.deliveryHeld && this.waitingOnPause > 0) {
            // Released while a submit waits on the pause (the server sends held ones one ack at a time): acked now.
            this.stats.ackedEarly++;
            this.ack([ref]);
          } else this.heldHere.set(refKey(ref.taskId, ref.sampleIndex), ref);
          this.queue.push(kind.value);
          break;
        }
      }
    });
    const fail = (err: ServiceError | Error): void => {
      this.ended = true;
      this.endedWith ??= err;
      failed(err);
      for (const waiters of this.pending.values()) for (const w of waiters) w.reject(err);
      this.pending.clear();
      this.endRetries();
      this.queue.end(err);
    };
    this.call.on('error', fail);
    this.call.on('end', () => {
      this.ended = true;
      const err = new Error('rollout stream ended');
      this.endedWith ??= err;
      failed(err);
      for (const waiters of this.pending.values()) for (const w of waiters) w.reject(err);
      this.pending.clear();
      this.endRetries();
      this.queue.end();
    });
    this.call.write({
      kind: { $case: 'open', value: { sessionId: options.sessionId ?? '', resume: options.resume ?? false, stageEvents: options.stageEvents ?? false } },
    });
  }

  /**
   * Queues a task; resolves when the server accepts it, rejects with TaskRejectedError naming the field. A temporary
   * refusal (`retryable`) is submitted again for up to `retryRejectedForMs` (see {@link SessionOptions}) before it
   * rejects. A spec that cannot be encoded (e.g. a bigint in `instance`) is rejected here, alone (field `instance`):
   * written to the stream, it would make grpc-js cancel the whole call. After the stream ended, or after `close()`,
   * rejects at once.
   */
  submit(task: TaskInput): Promise<TaskAccepted> {
    if (this.ended) return Promise.reject(new Error(`rollout stream ended: ${this.endedWith?.message ?? 'closed'}`));
    if (this.closing) return Promise.reject(new Error('session closed: submit before close()'));
    if (hasLoneSurrogate(task.taskId)) {
      // protobufjs would write the lone surrogate as bytes that are not UTF-8: the server refuses those by field but
      // cannot name a task id it could not decode, so the answer would never find this submit.
      return Promise.reject(new TaskRejectedError(task.taskId, 'task_id', 'task_id: holds a lone surrogate (UTF-8 cannot carry it)', status.INVALID_ARGUMENT));
    }
    const request: RolloutRequest = { kind: { $case: 'task', value: TaskSpec.fromPartial({ numSamples: 1, ...task }) } };
    let bytes: Uint8Array;
    try {
      bytes = RolloutRequest.encode(request).finish();
    } catch (err) {
      return Promise.reject(new TaskRejectedError(task.taskId, 'instance', `the spec cannot be encoded: ${err instanceof Error ? err.message : String(err)}`, status.INVALID_ARGUMENT));
    }
    return new Promise((resolve, reject) => this.send({ taskId: task.taskId, bytes, resolve, reject, cancelled: false, refusedByPause: false }));
  }

  /**
   * Cancels a task: its unfinished samples end with status CANCELLED (and still arrive). A submit of it waiting to be
   * sent again after a temporary refusal is not: it rejects at once with that refusal (the task never ran).
   */
  cancel(taskId: string): void {
    for (const s of this.pending.get(taskId) ?? []) s.cancelled = true; // refused later: not sent again
    for (const s of [...this.retrying]) {
      if (s.taskId !== taskId) continue;
      this.dropRetry(s);
      s.reject(s.refusal!);
    }
    if (!this.ended && !this.halfClosed) this.call.write({ kind: { $case: 'cancel', value: { taskId } } });
    this.maybeHalfClose();
  }

  /**
   * Acks every trajectory of these tasks the server has sent this session so far (samples not sent yet, e.g. held
   * while delivery is paused, are not covered and come later).
   */
  ackTasks(taskIds: string[]): void {
    if (this.halfClosed || this.ended) return;
    const step = this.maxAckEntries;
    for (let i = 0; i < taskIds.length; i += step) this.call.write({ kind: { $case: 'ack', value: { taskIds: taskIds.slice(i, i + step), trajectories: [] } } });
    const tasks = new Set(taskIds);
    if (this.autoAck) {
      // Acked: neither acked early again nor when consumed.
      for (const [key, ref] of this.heldHere) if (tasks.has(ref.taskId)) this.heldHere.delete(key);
      return;
    }
    for (const key of this.unacked) if (tasks.has(key.slice(key.indexOf('\u0000') + 1))) this.unacked.delete(key);
    this.maybeHalfClose();
  }

  /** Tells the server these trajectories are safely received (a resumed session will not get them again). */
  ack(refs: { taskId: string; sampleIndex: number }[]): void {
    if (this.halfClosed || this.ended) return;
    const step = this.maxAckEntries;
    for (let i = 0; i < refs.length; i += step) this.call.write({ kind: { $case: 'ack', value: { taskIds: [], trajectories: refs.slice(i, i + step) } } });
    if (this.autoAck) {
      for (const r of refs) this.heldHere.delete(refKey(r.taskId, r.sampleIndex));
      return;
    }
    for (const r of refs) this.unacked.delete(refKey(r.taskId, r.sampleIndex));
    this.maybeHalfClose();
  }

  /**
   * No more submits. The stream is half-closed once every accepted sample has been received and consumed
   * (so the last acks still reach the server); the server then ends it and iteration finishes.
   */
  close(): void {
    this.closing = true;
    this.maybeHalfClose();
  }

  /** Drops the stream at once (the session stays resumable on the server for a while). */
  abort(): void {
    this.ended = true;
    this.endRetries();
    cancelCall(this.call);
  }

  /**
   * Trajectories in completion order; ends when the server has delivered all of the session's. Leaving the loop
   * early (`break`, `return`, an exception in its body) cancels the call, as nice-grpc's clients do: the server
   * sees CANCELLED at once and keeps the session resumable with everything not acked, instead of writing into a
   * stream nobody reads. With autoAck, a trajectory is acked when the loop comes back for the next one (those of one
   * turn of the event loop in one Ack); the one the loop left on is not (its processing may not have finished), so a
   * resumed session gets it again. (The Python client's default "consumed" ack mode; see docs/python-client.md.)
   */
  async *trajectories(): AsyncGenerator<Trajectory> {
    let finished = false;
    try {
      for await (const t of this.queue) {
        yield t;
        this.consumed++;
        if (this.autoAck) this.ackConsumed({ taskId: t.taskId, sampleIndex: t.sampleIndex });
        this.maybeHalfClose();
      }
      finished = true;
    } finally {
      this.flushConsumedAcks(); // those the loop came back past: written before the call is cancelled
      if (!finished && !this.ended) {
        this.ended = true;
        this.endRetries();
        cancelCall(this.call);
      }
    }
  }

  /** Acks a consumed trajectory with the others of this turn of the event loop (a loop over buffered ones is one turn). */
  private ackConsumed(ref: { taskId: string; sampleIndex: number }): void {
    this.consumedRefs.push(ref);
    if (this.consumedRefs.length >= this.maxAckEntries) this.flushConsumedAcks();
    else this.ackSoon ??= setImmediate(() => this.flushConsumedAcks());
  }

  private flushConsumedAcks(): void {
    if (this.ackSoon) clearImmediate(this.ackSoon);
    this.ackSoon = undefined;
    if (this.consumedRefs.length === 0) return;
    // Not those acked early meanwhile (retryRejectedForMs): acked once.
    const refs = this.consumedRefs.filter((r) => this.heldHere.has(refKey(r.taskId, r.sampleIndex)));
    this.consumedRefs = [];
    if (refs.length > 0) this.ack(refs);
  }

  /** Writes a submit's spec and waits for its answer (again, after a temporary refusal). */
  private send(s: Submission): void {
    const list = this.pending.get(s.taskId) ?? [];
    list.push(s);
    this.pending.set(s.taskId, list);
    this.flow();
    this.call.write(s.bytes);
  }

  /**
   * A submit refused for now: scheduled to be sent again after its backoff, true; false when it is not (the refusal
   * is permanent, the budget is spent, the task was cancelled, the stream ended): it then rejects with the refusal.
   */
  private retryLater(s: Submission, refusal: TaskRejectedError): boolean {
    if (!refusal.retryable || s.cancelled || this.ended || this.retryRejectedForMs === 0) return false;
    s.schedule ??= new RetrySchedule(this.retryRejectedForMs);
    const delay = s.schedule.next();
    if (delay === undefined) return false;
    s.refusal = refusal;
    const byPause = refusal.code === status.RESOURCE_EXHAUSTED && this.deliveryHeld;
    if (byPause !== s.refusedByPause) this.waitingOnPause += byPause ? 1 : -1;
    s.refusedByPause = byPause;
    // The caller is inside submit() and cannot consume what keeps the pause: acked now (see retryRejectedForMs).
    if (byPause) this.ackEarly();
    this.stats.rejectionsRetried++;
    this.retrying.add(s);
    s.timer = setTimeout(() => {
      s.timer = undefined;
      this.retrying.delete(s);
      if (this.ended) {
        // Left (a loop that broke off cancels the call a macrotask later): never sent into a stream going away.
        this.leavePauseWait(s);
        s.reject(refusal);
        return;
      }
      this.send(s);
    }, delay);
    return true;
  }

  /** With autoAck, acks every trajectory received and not acked yet (a submit waits on paused delivery). */
  private ackEarly(): void {
    if (!this.autoAck || this.heldHere.size === 0) return;
    const refs = [...this.heldHere.values()];
    this.stats.ackedEarly += refs.length;
    this.ack(refs);
  }

  /** A submit leaves the retry wait without being sent again (cancelled, the stream ended). */
  private dropRetry(s: Submission): void {
    clearTimeout(s.timer);
    s.timer = undefined;
    this.retrying.delete(s);
    this.leavePauseWait(s);
  }

  private leavePauseWait(s: Submission): void {
    if (!s.refusedByPause) return;
    s.refusedByPause = false;
    this.waitingOnPause--;
  }

  /** The stream ended: submits waiting for a retry reject with their refusal (they never ran; submit them elsewhere). */
  private endRetries(): void {
    for (const s of [...this.retrying]) {
      this.dropRetry(s);
      s.reject(s.refusal!);
    }
  }

  private maybeHalfClose(): void {
    if (!this.closing || !this.isOpen || this.halfClosed || this.ended || this.pending.size > 0 || this.retrying.size > 0) return;
    // Checked after every trajectory consumed: kept O(1) with running counts.
    const expected = this.inherited + this.expected;
    if (this.received < expected || this.consumed < this.received) return;
    if (this.unacked.size > 0) {
      // Everything is here and consumed, but the caller has not acked it all (autoAck off): iteration ends now; the
      // stream stays open for those acks and is half-closed after the last one.
      this.queue.end();
      return;
    }
    this.flushConsumedAcks(); // the last acks go before the half-close
    this.halfClosed = true;
    this.call.end();
  }

  private count(t: Trajectory): void {
    const task = this.openTasks.get(t.taskId);
    if (!task) {
      // Owed from before this stream (a resumed session) or replayed for a task re-sent after it completed.
      this.received++;
      return;
    }
    if (task.got.has(t.sampleIndex)) return;
    task.got.add(t.sampleIndex);
    this.received++;
    if (task.got.size >= task.numSamples) this.openTasks.delete(t.taskId);
  }

  /** Answers the first submit of `taskId` still waiting for an answer, unless `retried` takes it back (a refusal for now). */
  private settle(taskId: string, fn: (p: Submission) => void, retried?: (p: Submission) => boolean): void {
    const list = this.pending.get(taskId);
    const first = list?.shift();
    if (list && list.length === 0) this.pending.delete(taskId);
    if (first && retried?.(first)) return this.flow();
    if (first) this.leavePauseWait(first);
    this.flow();
    if (first) fn(first);
  }

  /**
   * Pauses reading the call while `highWater` trajectories wait unread - but never while a submit waits for its answer:
   * `accepted` travels on the same call behind the trajectories, and a trainer that submits its batch (awaiting each
   * submit) before it reads would wait for ever. Unread trajectories are unacked, so the server's own bound
   * (sessions.maxUnackedBytes) still bounds what the queue can hold while reading goes on.
   */
  private flow(full: boolean = this.full): void {
    this.full = full;
    // A submit waiting for its retry waits for an answer too (and acks early what arrives while delivery is paused).
    const pause = full && this.pending.size === 0 && this.retrying.size === 0;
    if (pause === this.paused) return;
    this.paused = pause;
    if (pause) this.call.pause();
    else this.call.resume();
  }
}

function refKey(taskId: string, sampleIndex: number): string {
  return `${sampleIndex}\u0000${taskId}`;
}

/** How the client reaches a server: bearer tokens and TLS (PEM contents, not paths). */
export interface ConnectionOptions {
  /** RolloutService bearer token (the server's `auth.token`), sent on every call, streams included. */
  token?: string;
  /** BackendService bearer token (the server's admin token); unset: `token` (a server with no admin token takes it there). */
  adminToken?: string;
  /**
   * TLS instead of plaintext. `ca`: the CA that signed the server's certificate (default: the system's roots);
   * `cert` + `key`: this client's certificate for a server that asks for one (mTLS).
   */
  tls?: { ca?: Buffer; cert?: Buffer; key?: Buffer };
  /**
   * HTTP/2 keepalive: the client pings the server every `timeMs` (default 30 s) and drops the connection when the
   * answer does not come within `timeoutMs` (default 10 s), so a server whose host vanished without closing the
   * connection (power loss, a NAT that forgot the flow) fails the streams within about timeMs + timeoutMs instead
   * of leaving them waiting forever. `timeMs: 0` turns pings off. The server does not police client pings.
   */
  keepalive?: { timeMs?: number; timeoutMs?: number };
  /**
   * Largest message this client takes (default 256 MiB, as the Python client's). The server sends nothing over its own
   * `maxMessageBytes` (default 64 MiB); a server configured above this client's bound needs it raised to match, or a
   * trajectory between the two is a RESOURCE_EXHAUSTED on the stream.
   */
  maxReceiveMessageBytes?: number;
}

/**
 * Cancels a call one macrotask later. grpc-js (1.14.7, ResolvingCall.getConfig) creates a call's transport stream in a
 * promise callback once the method's config is known, without checking whether the call was cancelled meanwhile: a
 * cancel in that window — right after a stream is opened — ends the call here while its stream still goes out and is
 * never reset, so the server keeps the session attached (it never expires) or the Watch open (holding one of
 * `watch.maxOpen`) until the connection closes. One macrotask later that callback has run and the cancel reaches the
 * stream (an earlier cancel is checked by getConfig itself).
 */
function cancelCall(call: { cancel(): void }): void {
  setImmediate(() => call.cancel());
}

/** A client interceptor adding `authorization: Bearer <token>` to every call (works on plaintext channels too). */
function bearer(token: string): Interceptor {
  return (options, nextCall) =>
    new InterceptingCall(nextCall(options), {
      start: (metadata, listener, next) => {
        metadata.set('authorization', `Bearer ${token}`);
        next(metadata, listener);
      },
    });
}

/** The TypeScript client over the generated grpc-js stubs. */
export class RolloutClient {
  readonly rollout: RolloutServiceClient;
  readonly backends: BackendServiceClient;

  constructor(address: string, options: ConnectionOptions = {}) {
    const keepaliveMs = options.keepalive?.timeMs ?? 30_000;
    const opts = {
      'grpc.max_receive_message_length': options.maxReceiveMessageBytes ?? 256 << 20,
      ...(keepaliveMs > 0 && {
        'grpc.keepalive_time_ms': keepaliveMs,
        'grpc.keepalive_timeout_ms': options.keepalive?.timeoutMs ?? 10_000,
        // Also while no call is open: a session stream between tasks is a call, but a client about to open one
        // should learn the server is gone before it waits on it.
        'grpc.keepalive_permit_without_calls': 1,
      }),
    };
    const { tls } = options;
    for (const [name, value] of [['token', options.token], ['adminToken', options.adminToken]] as const) {
      // What HTTP/2 metadata can carry; anything else would throw inside grpc-js on every call, message included.
      const problem = value === undefined ? undefined : tokenProblem(value);
      if (problem !== undefined) throw new Error(`${name}: ${problem}`);
    }
    const adminToken = options.adminToken ?? options.token;
    const channel = tls ? credentials.createSsl(tls.ca ?? null, tls.key ?? null, tls.cert ?? null) : credentials.createInsecure();
    this.rollout = new RolloutServiceClient(address, channel, { ...opts, ...(options.token && { interceptors: [bearer(options.token)] }) });
    this.backends = new BackendServiceClient(address, channel, { ...opts, ...(adminToken && { interceptors: [bearer(adminToken)] }) });
  }

  openSession(options: SessionOptions = {}): RolloutSession {
    return new RolloutSession(this.rollout, options);
  }

  submit(task: TaskInput): Promise<{ taskId: string; numSamples: number; duplicate: boolean }> {
    return promisify((cb) => this.rollout.submit({ task: TaskSpec.fromPartial({ numSamples: 1, ...task }) }, cb));
  }

  getTrajectory(taskId: string, options: { sampleIndex?: number; wait?: boolean; deadlineMs?: number } = {}): Promise<GetTrajectoryResponse> {
    const deadline = callDeadline(options.deadlineMs ?? 600_000);
    return promisify((cb) =>
      this.rollout.getTrajectory({ taskId, wait: options.wait ?? false, ...(options.sampleIndex !== undefined && { sampleIndex: options.sampleIndex }) }, new Metadata(), { deadline }, cb),
    );
  }

  cancel(taskId: string): Promise<{ cancelled: number }> {
    return promisify((cb) => this.rollout.cancel({ taskId }, cb));
  }

  listEnvironments(): Promise<ListEnvironmentsResponse> {
    return promisify((cb) => this.rollout.listEnvironments({}, cb));
  }

  /** Dashboard tail; iterate, and `return` (break) to stop. */
  watch(request: Partial<WatchRequest> = {}): AsyncIterable<WatchResponse> & { cancel: () => void } {
    const call = this.rollout.watch({ environments: [], groupIds: [], fullTrajectories: false, stageEvents: false, statsIntervalMs: 0, ...request });
    const queue = new AsyncQueue<WatchResponse>(1024, () => call.pause(), () => call.resume());
    call.on('data', (m: WatchResponse) => queue.push(m));
    call.on('error', (err: ServiceError) => queue.end(err.code === 1 ? undefined : err));
    call.on('end', () => queue.end());
    return Object.assign(queue, { cancel: () => cancelCall(call) });
  }

  addBackend(request: Partial<AddBackendRequest> & { url: string }): Promise<Backend | undefined> {
    return promisify<{ backend?: Backend | undefined }>((cb) =>
      this.backends.addBackend({ kind: 0, maxConcurrency: 0, id: '', model: '', logprobsMode: 0, ...request }, new Metadata(), cb),
    ).then((r) => r.backend);
  }

  listBackends(): Promise<Backend[]> {
    return promisify<{ backends: Backend[] }>((cb) => this.backends.listBackends({}, new Metadata(), cb)).then((r) => r.backends);
  }

  removeBackend(id: string, drain = false): Promise<void> {
    return promisify((cb) => this.backends.removeBackend({ id, drain }, new Metadata(), cb)).then(() => undefined);
  }

  /**
   * Pauses generation around a weight update: on every engine, or on `backendId` only. Resolves with the engines
   * now paused (WAIT: once their requests in flight have finished).
   *
   * @example
   * await client.pauseGeneration(PauseMode.PAUSE_MODE_ABORT);
   * await trainer.pushWeights();                       // the engines are idle
   * await client.resumeGeneration({ policyVersion: 8 }); // interrupted turns continue, sampled by version 8
   */
  pauseGeneration(mode: PauseMode, options: { backendId?: string; deadlineMs?: number } = {}): Promise<Backend[]> {
    const deadline = callDeadline(options.deadlineMs ?? 600_000);
    return promisify<{ backends: Backend[] }>((cb) =>
      this.backends.pauseGeneration({ backendId: options.backendId ?? '', mode }, new Metadata(), { deadline }, cb),
    ).then((r) => r.backends);
  }

  /** Resumes generation (every engine, or `backendId`), recording the policy version they serve from now on when given. */
  resumeGeneration(options: { backendId?: string; policyVersion?: number } = {}): Promise<Backend[]> {
    return promisify<{ backends: Backend[] }>((cb) =>
      this.backends.resumeGeneration(
        { backendId: options.backendId ?? '', ...(options.policyVersion !== undefined && { policyVersion: options.policyVersion }) },
        new Metadata(),
        cb,
      ),
    ).then((r) => r.backends);
  }

  close(): void {
    this.rollout.close();
    this.backends.close();
  }
}

function promisify<T>(start: (cb: (err: ServiceError | null, value?: T) => void) => void): Promise<T> {
  return new Promise((resolve, reject) => start((err, value) => (err ? reject(err) : resolve(value as T))));
}

/** The Rollout stream's request serializer: a request's bytes pass as they are, a request object is encoded. */
function encodeRequest(request: RolloutRequest | Uint8Array): Buffer {
  if (request instanceof Uint8Array) return Buffer.from(request.buffer, request.byteOffset, request.byteLength);
  return Buffer.from(RolloutRequest.encode(request).finish());
}

/**
 * A call's deadline `ms` from now, at most a minute short of MAX_TIMER_MS (~24.8 days): a grpc-js server (1.14.7 and
 * before) truncates the grpc-timeout header's milliseconds to an int32, so a longer one (or one the header rounds up
 * past it: it carries whole seconds at that size) is negative and ends the call at once with DEADLINE_EXCEEDED.
 * Infinity: no deadline.
 */
function callDeadline(ms: number): Date | number {
  return ms === Infinity ? Infinity : new Date(Date.now() + Math.min(Math.max(0, ms), MAX_TIMER_MS - 60_000));
}
