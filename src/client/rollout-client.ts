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
import { budgetOf, RETRY_CAP_MS, RetrySchedule, retryBudgetOf } from './refusal-retry.js';
import { MAX_TIMER_MS } from '../timers.js';
import { RecentKeys } from './recent-keys.js';

/** Keys of received trajectories a reconnecting session remembers per stream (RolloutSession.seen); Python's 65,536 too. */
const MAX_SEEN = 65_536;

/**
 * A re-opened stream that stays up this long (ms), or delivers something new (a trajectory, an answer to a submit),
 * ends its outage: the next break starts a fresh `reconnectForMs` budget. Shorter-lived streams that deliver nothing
 * (a server or proxy that opens every stream and breaks it soon after) spend one budget, counted from the first break.
 */
const HEALTHY_STREAM_MS = 30_000;

/**
 * With reconnect: streams in a row that may end on a message this client cannot parse (grpc-js: INTERNAL "Response
 * message parsing error") before the session fails with it. Garbled once (a server's encoder bug that does not repeat, a
 * proxy's fault) costs a re-open; the same bytes on every resume (an unacked trajectory is re-sent each time) would
 * otherwise be re-opened for the whole reconnectForMs, for ever with Infinity. As the Python client's
 * _UNDECODABLE_RETRIES + 1. "In a row": no other break, and no stream up {@link HEALTHY_STREAM_MS}, in between.
 */
const MAX_GARBLED_STREAMS = 3;

/** Protocol violations of a server said as process warnings per session (all are counted: stats.protocolViolations). */
const MAX_VIOLATION_WARNINGS = 10;

/** Bounds of a session that tests lower (not options: the defaults are what a trainer wants). @internal */
export interface SessionLimits {
  /** Keys of received trajectories remembered per stream (default {@link MAX_SEEN}). */
  maxRememberedKeys?: number;
}

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

/**
 * A task this session had submitted and that its session lost (see {@link SessionOptions.resubmitLostTasks}): the
 * server no longer knows the session, and the task could not be submitted again without mixing two runs in its group.
 */
export class TaskLostError extends Error {
  constructor(
    readonly taskId: string,
    /** Samples of the task (0: not known, the server never answered its submit). */
    readonly numSamples: number,
    /** The samples that reached this session before it was lost (they were delivered, and stay so). */
    readonly receivedSampleIndexes: number[],
    why: string,
    /** The re-open's NOT_FOUND, or the refusal of the spec submitted again. */
    cause: Error,
  ) {
    super(`task ${taskId} lost with its session (the server no longer knows the session: expired, or restarted without a journal): ${why}`, { cause });
    this.name = 'TaskLostError';
  }
}

/**
 * The server did not answer a submit's spec (neither accepted nor refused) within
 * {@link SessionOptions.submitTimeoutMs}. The task may have been accepted meanwhile: the session cancelled it on the
 * server (its samples, if it runs, end CANCELLED and still arrive). Submitting it again (the same task id) is safe:
 * a task the server took is answered as owed, never run twice.
 */
export class SubmitTimeoutError extends Error {
  /** As grpc-js reports a call past its deadline. */
  readonly code = status.DEADLINE_EXCEEDED;

  constructor(
    readonly taskId: string,
    readonly timeoutMs: number,
  ) {
    super(`task ${taskId}: no answer from the server to its spec within submitTimeoutMs (${timeoutMs} ms); cancelled on the server in case it was accepted`);
    this.name = 'SubmitTimeoutError';
  }
}

export interface SessionOptions {
  sessionId?: string;
  resume?: boolean;
  stageEvents?: boolean;
  /**
   * Trajectories buffered before the client stops reading (gRPC flow control reaches the server), unless a submit
   * waits for its answer (which comes on the same call): the server's sessions.maxUnackedBytes bounds the rest.
   * A whole number of at least 1 (default 1024; Infinity: never stop reading); anything else is a RangeError.
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
  /**
   * How long (ms) a broken stream is re-opened for, as the Python client does (default 0: off, a broken stream ends
   * the session with its error). A transport break (UNAVAILABLE: a server restart, a proxy reset; INTERNAL or UNKNOWN;
   * RESOURCE_EXHAUSTED ending a stream whose caller took nothing for the server's sessions.stalledMs)
   * re-opens the same session with `resume`, with backoff (50 ms doubling to 2 s) until this budget, counted from
   * the first break of the outage, is spent; the session then fails with the last error. The outage ends once a
   * re-opened stream delivers something new (a trajectory, an answer to a submit) or stays up 30 s: a server or proxy
   * that takes every stream and breaks it again without that (after a second or ten) spends one budget, not a fresh
   * one per re-open. A stream that ends on a message this client cannot parse (INTERNAL "Response message parsing
   * error": garbled bytes) is re-opened too, but the third in a row ends the session with it (the server re-sends an
   * unacked trajectory, the same bytes, on every resume), as the Python client. What a re-open would meet again is not retried:
   * the caller's `abort()` (CANCELLED), UNAUTHENTICATED, INVALID_ARGUMENT, a session the server no longer knows
   * (NOT_FOUND: expired, or a restarted server without a journal; see `resubmitLostTasks` to go on afresh instead) or
   * that another stream took over (ABORTED) end the session with that error. On the re-opened stream: the specs whose
   * submit had no answer are sent again (the server answers a task it already took `already_owed`: it never runs
   * twice), so are the cancels; trajectories the server re-sends that this session had received already are dropped
   * (by task id and sample index), and acked again when they had been acked (that ack may have been lost with the
   * stream); `trajectories()` goes on, each trajectory once.
   * Counted in `stats.reconnects` (re-opens tried) and `stats.redelivered` (what the server re-sent, duplicates
   * included; `stats.duplicatesDropped` those dropped). Every session (with or without this) remembers one small key
   * per trajectory received on the current stream, at most 65,536 (the oldest forgotten; cleared at each re-open to
   * what was re-sent), so a trajectory a server sends twice on one stream is delivered once (dropped, counted in
   * `stats.duplicatesDropped`, acked again if it had been acked).
   */
  reconnectForMs?: number;
  /**
   * With `reconnectForMs`: a re-open that finds the session gone (NOT_FOUND: it expired, or the server restarted
   * without a journal) opens it afresh instead of ending it (default false: the session ends with NOT_FOUND, as
   * `reconnectForMs` says), within the same budget, and what it owed is submitted again where that cannot deliver a
   * sample twice: the specs with no answer yet (as on any re-open), and every task of which no sample has arrived here
   * (its spec, kept until its last sample arrives: the server runs it again, or sends it from its cache of finished
   * tasks). A task some of whose samples arrived is not submitted again: a second run would mix two runs in one group
   * or send those samples twice. It is lost alone, the session going on: `onTaskLost` is called with a
   * {@link TaskLostError} (listed in `lostTasks` too), and its missing samples are not waited for. So is a task
   * submitted again and refused, a task cancelled (not run again), and, on a session resumed from a predecessor
   * (`resume`), a task the server answered as owed (what reached the predecessor is not known here).
   * Counted in `stats.sessionsLost`, `stats.resubmitted` and `stats.tasksLost`. Costs each open task's encoded spec.
   */
  resubmitLostTasks?: boolean;
  /**
   * How long (ms) a submit waits for the server's answer to its spec (accepted or refused), counted from each time
   * the spec is written (again after a temporary refusal or a re-open), before it rejects with a
   * {@link SubmitTimeoutError} and the task is cancelled on the server (it may have been accepted); the session goes
   * on. Default: no bound, because a full server answers a spec only once it has room for it (admission is how it
   * pushes back, and it may take as long as a rollout): set it to what your server's load allows when a server that
   * takes the stream and never answers must not stop the caller for good. An answer that comes later is taken as the
   * task's (its CANCELLED samples are delivered), not as another submit's.
   */
  submitTimeoutMs?: number;
  /**
   * How long (ms) each stream of the session waits for the server's SessionOpened (default 60 000; Infinity: no bound).
   * Past it, the call is cancelled and, without `reconnectForMs`, the session fails (`opened`, the waiting submits and
   * iteration reject) with an {@link OpenTimeoutError} (DEADLINE_EXCEEDED) naming the server; with `reconnectForMs` it
   * is a broken stream, re-opened within that budget. Unlike a submit's answer (see `submitTimeoutMs`), a default bound
   * is safe here: a server sends SessionOpened first thing when it takes the stream (ahead of anything queued, with
   * no admission wait), and a server that is down fails the call at once (UNAVAILABLE); what it catches is a server
   * or proxy that takes the stream and never answers, which would otherwise leave `await session.opened` - and
   * everything behind it - waiting for ever.
   */
  openTimeoutMs?: number;
}

/**
 * The server took a session's stream but sent no SessionOpened within {@link SessionOptions.openTimeoutMs}: a server
 * that hangs, or a proxy that accepts streams and forwards nothing. `code` as grpc-js reports a call past its deadline.
 */
export class OpenTimeoutError extends Error {
  readonly code = status.DEADLINE_EXCEEDED;
  /** As a grpc-js ServiceError carries it. */
  readonly details: string;
  readonly metadata = new Metadata();

  constructor(
    /** The server's address, as the channel names it. */
    readonly target: string,
    readonly sessionId: string,
    readonly timeoutMs: number,
  ) {
    const session = sessionId === '' ? 'a new session' : `session ${sessionId}`;
    super(`rollout server ${target} took the stream of ${session} but sent no SessionOpened within openTimeoutMs (${timeoutMs} ms): a server that hangs, or a proxy that forwards nothing`);
    this.name = 'OpenTimeoutError';
    this.details = this.message;
  }
}

/** One submit until the server answers it, or until a retry after a temporary refusal is due. */
interface Submission {
  readonly taskId: string;
  readonly bytes: Uint8Array;
  /** The spec's num_samples: an `accepted` saying another number is a faulty server's (see onResponse). */
  readonly numSamples: number;
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
  /** With resubmitLostTasks: this submit made the task's entry in `specs` (forgotten if the task is refused). */
  tracked?: boolean;
  /** Ends the wait for the answer to the spec written last (see submitTimeoutMs). */
  answerTimer?: NodeJS.Timeout;
}

/**
 * One Rollout session: submit tasks, iterate trajectories as they finish (completion order). Call `close()`
 * after the last submit; iteration ends once the server has delivered every trajectory of the session. One stream,
 * unless `reconnectForMs` has a broken one re-opened (see {@link SessionOptions.reconnectForMs}).
 *
 * @example
 * const session = client.openSession();
 * await session.submit({ taskId: 't1', environment: 'math', numSamples: 4, instance: { problem: '1+1?', answer: '2' } });
 * session.close();
 * for await (const t of session.trajectories()) console.log(t.sampleIndex, t.reward);
 */
export class RolloutSession {
  readonly opened: Promise<SessionOpened>;
  /**
   * The current stream. Takes requests, or a request's bytes already encoded (a task, encoded once in submit()).
   * Replaced when a broken stream is re-opened (see {@link SessionOptions.reconnectForMs}).
   */
  private call!: ClientDuplexStream<RolloutRequest | Uint8Array, RolloutResponse>;
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
  /** Trajectories of this stream counted against `inherited` (of no task accepted on it). */
  private fromBefore = 0;
  /** Protocol violations said as process warnings so far (see {@link violation}). */
  private violationsWarned = 0;
  /** Streams in a row that ended on a message this client could not parse (see {@link MAX_GARBLED_STREAMS}). */
  private garbledInRow = 0;
  /** This stream's SessionOpened has come (reset when a broken stream is re-opened). */
  private isOpen = false;
  /** Trajectories received on this stream that count towards what it owes (a sample of an open task counted once). */
  private received = 0;
  /** Trajectories handed to the iterator (all streams), and those the consumer took. */
  private pushed = 0;
  private consumed = 0;
  /** With autoAck off: trajectories received and not acked yet (task, sample), which keep the stream open. */
  private readonly unacked = new Set<string>();
  /** With autoAck: trajectories consumed in this turn of the event loop, acked together (one Ack, not one each). */
  private consumedRefs: { taskId: string; sampleIndex: number }[] = [];
  /** The trajectory queue is at its high-water mark (see {@link flow}), and whether the call's reading is paused. */
  private full = false;
  private paused = false;
  /** Trajectories this stream queued before its SessionOpened (see {@link flow}), and the queue's high-water mark. */
  private queuedBeforeOpen = 0;
  private readonly highWater: number;
  private ackSoon: NodeJS.Immediate | undefined;
  /** Why the stream ended, once it has: a submit after that fails at once with it. */
  private endedWith: Error | undefined;
  /** Submits sent and not answered yet, per task id in the order they were sent (the order of their answers). */
  private readonly pending = new Map<string, Submission[]>();
  /** Submits refused for now, waiting for their retry (see {@link SessionOptions.retryRejectedForMs}). */
  private readonly retrying = new Set<Submission>();
  private readonly retryRejectedForMs: number;
  private readonly submitTimeoutMs: number;
  private readonly openTimeoutMs: number;
  /**
   * Per task id, submits of this stream that timed out (submitTimeoutMs) and whose answer may still come: answers of a
   * task come in the order its specs were written, and those submits were its first, so its next answers are theirs.
   */
  private readonly unanswered = new Map<string, number>();
  /** Removes the listener of the signal given to close(). */
  private closeListener: (() => void) | undefined;
  /** The server holds delivery to this session for acks (its last DeliveryPaused notice was not `resumed`). */
  private deliveryHeld = false;
  /** Submits refused because delivery was paused and not settled yet: while any waits, arrivals are acked early. */
  private waitingOnPause = 0;
  /** With autoAck: trajectories received and not acked yet (queued, being consumed), by refKey. */
  private readonly heldHere = new Map<string, { taskId: string; sampleIndex: number }>();
  private readonly client: RolloutServiceClient;
  private sessionId: string;
  private readonly stageEvents: boolean;
  /** Largest request the channel sends (its grpc.max_send_message_length), undefined: no bound. */
  private readonly maxSendBytes: number | undefined;
  private readonly reconnectForMs: number;
  /** The current call takes writes: false from a transport break until the stream is re-opened. */
  private connected = true;
  /** The re-open of a broken stream waiting for its backoff, and the budget of this outage. */
  private reconnectTimer: NodeJS.Timeout | undefined;
  private outage: RetrySchedule | undefined;
  /** When this outage's budget ends (performance.now() ms), its last break's error, and the re-open's own timer. */
  private outageUntil = 0;
  private outageError: Error | undefined;
  private openTimer: NodeJS.Timeout | undefined;
  private openedAt: number | undefined;
  /** This stream delivered something new (a trajectory, an answer to a submit): see {@link HEALTHY_STREAM_MS}. */
  private progressed = false;
  /**
   * With reconnect: refKeys of trajectories received on this stream, and (`before`) on the broken ones since the last
   * SessionOpened, whose acks the server may not have had: a re-sent one is a duplicate. The re-sent ones are the first
   * `redelivered` trajectories of the re-opened stream (Session.attach sends them before any other), but not
   * necessarily before SessionOpened, which the server sends ahead of its queue: `streamTrajectories` counts the
   * stream's trajectories until SessionOpened says how many were re-sent, `redeliveryLeft` those still to come after it.
   * Once all came, `before` is forgotten: what was re-sent and not acked is in `seen`. `seen` forgets its oldest key
   * past its cap ({@link MAX_SEEN}): a stream that stays up for a week must not keep every key. One forgotten is acked
   * long since (a trajectory still held here or unacked is recognised by those maps), and the server re-sends only
   * what it holds unacked.
   */
  private seen: RecentKeys;
  private before: Set<string> | undefined;
  private streamTrajectories = 0;
  private redeliveryLeft = 0;
  private readonly resumeFirst: boolean;
  private openedOnce = false;
  /** A stream broke after the session had half-closed with everything received and acked (see broke()). */
  private doneOnce = false;
  /**
   * With reconnect: tasks this session cancelled, cancelled again on a re-opened stream (the cancel may have been lost).
   * Forgotten once all the task's samples came on the stream that accepted it (a session cancelling tasks all week
   * must not keep, and re-send on every re-open, every id it ever cancelled), and bounded like `seen` otherwise.
   */
  private readonly cancels: RecentKeys;
  private readonly resubmitLost: boolean;
  /**
   * With resubmitLostTasks: each submitted task until its last sample arrives: its encoded spec, its samples (0 until
   * the server says) and those that arrived here (on any stream); `unknown`: what reached a predecessor is not known.
   */
  private readonly specs = new Map<string, { bytes: Uint8Array; asked: number; numSamples: number; got: Set<number>; unknown: boolean }>();
  /** The session was lost (NOT_FOUND on a re-open): the next re-open opens it afresh. */
  private fresh = false;
  /** The current stream was a re-open with resume (its NOT_FOUND means the session is gone). */
  private reopenedWithResume = false;
  /** Tasks lost with the session (see {@link SessionOptions.resubmitLostTasks}). */
  readonly lostTasks: TaskLostError[] = [];
  /** Called (in a microtask) for each task lost with the session (see {@link SessionOptions.resubmitLostTasks}). */
  onTaskLost: ((error: TaskLostError) => void) | undefined;
  /**
   * `rejectionsRetried`: temporary refusals submitted again; `ackedEarly`: trajectories acked before they were consumed
   * because a submit waited on paused delivery (see {@link SessionOptions.retryRejectedForMs}); `reconnects`,
   * `redelivered`, `duplicatesDropped`: see {@link SessionOptions.reconnectForMs}; `sessionsLost`, `resubmitted`,
   * `tasksLost`: see {@link SessionOptions.resubmitLostTasks}; `duplicatesDropped` also counts a trajectory a server
   * sent twice on one stream (dropped, delivered once); `callbackErrors`: exceptions thrown by `onTaskLost`,
   * `onDeliveryPaused` or `onStage`, or rejections of theirs when async (reported as process warnings, the session going on); `protocolViolations`:
   * messages of a faulty server ignored (see {@link violation}).
   */
  readonly stats = { rejectionsRetried: 0, ackedEarly: 0, reconnects: 0, redelivered: 0, duplicatesDropped: 0, sessionsLost: 0, resubmitted: 0, tasksLost: 0, callbackErrors: 0, protocolViolations: 0 };
  /**
   * The server paused delivery (this session's unacked trajectories reached its byte bound; ack to resume) or
   * resumed it (`resumed`). Nothing is dropped meanwhile.
   */
  onDeliveryPaused: ((notice: DeliveryPaused) => void) | undefined;
  /** Stage events, when the session asked for them. */
  onStage: ((event: NonNullable<Extract<RolloutResponse['kind'], { $case: 'stage' }>>['value']) => void) | undefined;
  private resolveOpened!: (s: SessionOpened) => void;
  private rejectOpened!: (e: Error) => void;

  constructor(client: RolloutServiceClient, options: SessionOptions = {}, maxSendMessageBytes?: number, limits: SessionLimits = {}) {
    // Checked before the call is opened: a session refused here leaves no stream behind.
    this.retryRejectedForMs = retryBudgetOf(options.retryRejectedForMs);
    this.submitTimeoutMs = budgetOf('submitTimeoutMs', options.submitTimeoutMs, Infinity);
    this.openTimeoutMs = budgetOf('openTimeoutMs', options.openTimeoutMs, QUICK_CALL_MS);
    if (this.openTimeoutMs === 0) throw new RangeError('openTimeoutMs: must be more than 0 milliseconds (Infinity: no bound)');
    this.reconnectForMs = budgetOf('reconnectForMs', options.reconnectForMs, 0);
    this.resubmitLost = options.resubmitLostTasks ?? false;
    if (this.resubmitLost && this.reconnectForMs === 0) throw new RangeError('resubmitLostTasks: needs reconnectForMs (a lost session is found by a re-open)');
    const highWater = options.highWater ?? 1024;
    // The queue stops the call when it holds exactly highWater: 0, a fraction or NaN would never stop it (no backpressure).
    if (highWater !== Infinity && !(Number.isInteger(highWater) && highWater >= 1)) {
      throw new RangeError(`highWater: must be a whole number of trajectories of at least 1 (Infinity: no bound), got ${String(options.highWater)}`);
    }
    this.client = client;
    this.seen = new RecentKeys(limits.maxRememberedKeys ?? MAX_SEEN);
    this.cancels = new RecentKeys(limits.maxRememberedKeys ?? MAX_SEEN);
    this.sessionId = options.sessionId ?? '';
    this.stageEvents = options.stageEvents ?? false;
    this.maxSendBytes = maxSendMessageBytes !== undefined && maxSendMessageBytes >= 0 ? maxSendMessageBytes : undefined;
    this.autoAck = options.autoAck ?? true;
    this.highWater = highWater;
    this.queue = new AsyncQueue<Trajectory>(
      highWater,
      () => this.flow(true),
      () => this.flow(false),
    );
    this.opened = new Promise((resolve, reject) => {
      this.resolveOpened = resolve;
      this.rejectOpened = reject;
    });
    this.opened.catch(() => undefined);
    this.resumeFirst = options.resume ?? false;
    this.attach(this.resumeFirst);
  }

  /** Opens a stream for the session (again, with resume, after a break) and routes its events here. */
  private attach(resume: boolean): void {
    // The generated rollout() would encode each request again; submit() has encoded its task already (to refuse an
    // unencodable one alone), so the stream takes those bytes as they are.
    const method = RolloutServiceService.rollout;
    const call = this.client.makeBidiStreamRequest(method.path, encodeRequest, method.responseDeserialize);
    this.call = call;
    this.connected = true;
    this.paused = false;
    this.queuedBeforeOpen = 0;
    this.progressed = false;
    // Sent before any answer, so known before the first trajectory arrives (and with it anything to ack).
    call.on('metadata', (headers: Metadata) => {
      if (call === this.call) this.maxAckEntries = maxAckEntriesOf(headers);
    });
    call.on('data', (response: RolloutResponse) => {
      // A broken stream's last messages (read after its error) are re-sent on the re-opened one if they count.
      if (call === this.call && this.connected) this.onResponse(response);
    });
    call.on('error', (err: ServiceError) => {
      if (call === this.call && this.connected) this.broke(err);
    });
    call.on('end', () => {
      // After an error too (grpc-js ends the readable side first): only an end without one ends the session here.
      if (call !== this.call || !this.connected) return;
      // The server ends a stream with OK only after this client half-closed with everything received. Any other end
      // (a server or proxy that misbehaves) would end iteration as if the session were done, the trajectories it still
      // owes lost silently: an error instead, which says so.
      const owed = this.inherited + this.expected - this.received;
      if (!this.halfClosed || owed > 0) {
        const why = this.halfClosed ? `${owed} trajectories still owed` : 'before this client closed the session';
        return this.fail(Object.assign(new Error(`rollout stream ended by the server (status OK) ${why}`), { code: status.INTERNAL }), true);
      }
      this.fail(new Error('rollout stream ended'), false);
    });
    call.write({ kind: { $case: 'open', value: { sessionId: this.sessionId, resume, stageEvents: this.stageEvents } } });
    // A server that takes the stream and never answers the open (see openTimeoutMs). reopen() may bound it sooner.
    clearTimeout(this.openTimer);
    this.openTimer = this.openTimeoutMs < MAX_TIMER_MS ? setTimeout(() => this.openTimedOut(call), this.openTimeoutMs) : undefined;
    this.flow();
  }

  /**
   * No SessionOpened on `call` within openTimeoutMs: without reconnect the session fails, naming the server; with it,
   * a broken stream (re-opened within the outage's budget). The call is cancelled either way.
   */
  private openTimedOut(call: ClientDuplexStream<RolloutRequest | Uint8Array, RolloutResponse>): void {
    this.openTimer = undefined;
    if (this.isOpen || this.ended || call !== this.call || !this.connected) return;
    const err = new OpenTimeoutError(this.target(), this.sessionId, this.openTimeoutMs);
    // First: the CANCELLED the cancel brings is then the old call's, ignored.
    if (this.reconnectForMs > 0) this.broke(err as ServiceError, true);
    else this.fail(err, true);
    cancelCall(call);
  }

  private onResponse(response: RolloutResponse): void {
    const kind = response.kind;
    if (!kind) return;
    switch (kind.$case) {
      case 'opened':
        // A resumed session's earlier tasks deliver here too: what was re-sent plus what is still running.
        this.inherited = kind.value.redelivered + kind.value.pending;
        this.isOpen = true;
        this.openedOnce = true;
        this.fresh = false;
        this.doneOnce = false;
        clearTimeout(this.openTimer);
        this.openTimer = undefined;
        this.openedAt = performance.now();
        // The first `redelivered` trajectories of this stream are what the server re-sent (Session.attach), some of which
        // may have come before this answer; after them, trajectories are new.
        this.redeliveryLeft = Math.max(0, kind.value.redelivered - this.streamTrajectories);
        if (this.redeliveryLeft === 0) this.before = undefined;
        if (this.stats.reconnects > 0) this.stats.redelivered += kind.value.redelivered;
        // The id the server chose (none asked for): a re-open resumes that one.
        this.sessionId = kind.value.sessionId || this.sessionId;
        this.resolveOpened(kind.value);
        this.flow(); // read until now whatever the queue held (see flow)
        this.maybeHalfClose();
        break;
      case 'accepted':
        // An answer nothing here waits for (a spec never written on this stream, or answered already): taken, it would
        // add samples nobody owes (the session never ends) or reset a task's count. A faulty server's.
        if (!this.pending.has(kind.value.taskId) && !this.unanswered.has(kind.value.taskId)) {
          this.violation(`TaskAccepted for task ${kind.value.taskId}, which has no spec waiting for an answer on this stream (never submitted, or answered already)`);
          break;
        }
        if (this.acceptedOtherGroup(kind.value)) break;
        // A task re-sent after a resume that the session had accepted before is counted in `inherited` already,
        // except the samples it had acked: those are sent again (resent_sample_indexes) and counted as they come.
        if (!this.openTasks.has(kind.value.taskId) && !kind.value.alreadyOwed) {
          this.openTasks.set(kind.value.taskId, { numSamples: kind.value.numSamples, got: new Set() });
          this.expected += kind.value.numSamples;
        } else if (kind.value.alreadyOwed && kind.value.resentSampleIndexes.length > 0) {
          this.inherited += kind.value.resentSampleIndexes.length;
          const open = this.openTasks.get(kind.value.taskId);
          for (const i of kind.value.resentSampleIndexes) {
            open?.got.delete(i);
            // Sent again on purpose (acked here before): delivered again, not dropped as a duplicate.
            this.seen.delete(refKey(kind.value.taskId, i));
            this.before?.delete(refKey(kind.value.taskId, i));
          }
        }
        this.settle(kind.value.taskId, (p) => {
          this.tracked(kind.value);
          p.resolve(kind.value);
        });
        this.maybeHalfClose();
        break;
      case 'rejected': {
        const refusal = new TaskRejectedError(kind.value.taskId, kind.value.field, kind.value.reason, kind.value.code);
        this.settle(
          kind.value.taskId,
          (p) => {
            if (p.tracked) this.specs.delete(p.taskId);
            p.reject(refusal);
          },
          (p) => this.retryLater(p, refusal),
        );
        this.maybeHalfClose();
        break;
      }
      case 'stage':
        this.notify('onStage', this.onStage, kind.value);
        break;
      case 'deliveryPaused':
        this.deliveryHeld = !kind.value.resumed;
        // A submit waits on the pause (refused, to be sent again): what keeps it must be acked (retryRejectedForMs).
        if (this.deliveryHeld && this.waitingOnPause > 0) this.ackEarly();
        this.notify('onDeliveryPaused', this.onDeliveryPaused, kind.value);
        break;
      case 'trajectory': {
        const ref = { taskId: kind.value.taskId, sampleIndex: kind.value.sampleIndex };
        const key = refKey(ref.taskId, ref.sampleIndex);
        if (this.reconnectForMs > 0) {
          this.streamTrajectories++;
          // Re-sent: the stream's first ones until SessionOpened, then its `redeliveryLeft` next ones.
          const before = this.before;
          const resent = before !== undefined && (!this.isOpen || this.redeliveryLeft-- > 0);
          if (this.isOpen && this.redeliveryLeft <= 0) this.before = undefined;
          if (resent && (before.has(key) || this.heldHere.has(key) || this.unacked.has(key))) {
            this.redeliveredAgain(ref, key);
            break;
          }
        }
        // Owed: a sample of a task accepted on this stream that has not come yet (a task this stream had in full, sent
        // again whole after the server forgot it, is owed anew).
        const open = this.openTasks.get(ref.taskId);
        if (open !== undefined && ref.sampleIndex >= open.numSamples) {
          // Counted, it would complete the group in place of a real sample (the session ending without it).
          this.violation(`trajectory of task ${ref.taskId} with sample_index ${ref.sampleIndex}, outside its ${open.numSamples} samples`);
          break;
        }
        const owed = open !== undefined && !open.got.has(ref.sampleIndex);
        // A sample of an open task that came already is a duplicate even once `seen` has forgotten its key.
        if (!owed && (open !== undefined || this.seen.has(key) || this.heldHere.has(key) || this.unacked.has(key))) {
          // Sent twice on this stream (a server or proxy that misbehaves): delivered once.
          this.sentTwice(ref, key);
          break;
        }
        if (open === undefined && this.isOpen && this.fromBefore >= this.inherited && !this.pending.has(ref.taskId) && !this.unanswered.has(ref.taskId)) {
          // Neither a task accepted on this stream, nor one of the trajectories SessionOpened (and resent samples) said
          // were owed from before it, nor one whose answer is on its way: counted, it would end the session before what
          // is owed came.
          this.violation(`trajectory of task ${ref.taskId} (sample ${ref.sampleIndex}), a task this stream was neither accepted nor owed`);
          break;
        }
        this.seen.add(key);
        this.progressed = true;
        this.count(kind.value);
        if (!this.autoAck) this.unacked.add(key);
        else if (this.deliveryHeld && this.waitingOnPause > 0) {
          // Released while a submit waits on the pause (the server sends held ones one ack at a time): acked now.
          this.stats.ackedEarly++;
          this.ack([ref]);
        } else this.heldHere.set(key, ref);
        this.pushed++;
        if (this.resubmitLost) this.arrived(ref);
        this.queue.push(kind.value);
        if (!this.isOpen) {
          this.queuedBeforeOpen++;
          this.flow();
        }
        break;
      }
    }
  }

  /**
   * An `accepted` whose num_samples is not its spec's (a faulty server's: no correct one accepts a task id with another
   * spec): counted, a larger group would never come whole (the session waiting for ever), a smaller one would drop
   * real samples as outside it. The submit rejects instead (TaskRejectedError, field `num_samples`), as the Python
   * client's, and the task is cancelled on the server; its samples, should they come, are not delivered as a group.
   */
  private acceptedOtherGroup(accepted: TaskAccepted): boolean {
    if (this.unanswered.has(accepted.taskId)) return false; // a late answer of a submit that timed out: not a waiting one's
    const spec = this.pending.get(accepted.taskId)?.[0];
    if (spec === undefined || spec.numSamples === accepted.numSamples) return false;
    const refusal = new TaskRejectedError(
      accepted.taskId,
      'num_samples',
      `the server at ${this.target()} accepted it with num_samples ${accepted.numSamples}, not the ${spec.numSamples} of its spec (a faulty server: the group would never come whole); cancelled there`,
      status.FAILED_PRECONDITION,
    );
    this.violation(`TaskAccepted for task ${accepted.taskId} with num_samples ${accepted.numSamples}, not the ${spec.numSamples} of its spec`);
    this.settle(accepted.taskId, (p) => {
      if (p.tracked) this.specs.delete(p.taskId);
      p.reject(refusal);
    });
    if (this.reconnectForMs > 0) this.cancels.add(accepted.taskId);
    if (this.connected && !this.halfClosed) this.call.write({ kind: { $case: 'cancel', value: { taskId: accepted.taskId } } });
    this.maybeHalfClose();
    return true;
  }

  /** With resubmitLostTasks: a submit answered `accepted` (see `specs`). */
  private tracked(accepted: TaskAccepted): void {
    const spec = this.specs.get(accepted.taskId);
    if (!spec) return;
    spec.numSamples = accepted.numSamples;
    // Owed from a predecessor's session: some of it may have reached that process.
    if (accepted.alreadyOwed && this.resumeFirst) spec.unknown = true;
    if (spec.got.size >= spec.numSamples) this.specs.delete(accepted.taskId);
  }

  /** With resubmitLostTasks: a trajectory handed to the iterator; its task is forgotten once all its samples came. */
  private arrived(ref: { taskId: string; sampleIndex: number }): void {
    const spec = this.specs.get(ref.taskId);
    if (!spec) return;
    spec.got.add(ref.sampleIndex);
    if (spec.numSamples > 0 && spec.got.size >= spec.numSamples) this.specs.delete(ref.taskId);
  }

  /**
   * A re-open found the session gone (resubmitLostTasks): the next re-open opens it afresh, with the specs of the
   * tasks none of whose samples arrived submitted again; any other task is lost alone (see resubmitLostTasks).
   */
  private sessionLost(err: Error): void {
    this.stats.sessionsLost++;
    this.fresh = true;
    // A new session re-sends nothing: nothing to recognise.
    this.before = undefined;
    this.seen = new RecentKeys(this.seen.cap);
    for (const [taskId, spec] of this.specs) {
      if (this.pending.has(taskId)) continue; // its submit had no answer: sent again with the others
      if (spec.got.size === 0 && !spec.unknown && !this.cancels.has(taskId)) {
        this.stats.resubmitted++;
        this.pending.set(taskId, [
          {
            taskId,
            bytes: spec.bytes,
            numSamples: spec.asked,
            resolve: () => undefined,
            // Refused (for good, or past retryRejectedForMs): lost; not when the whole session ended (its error says it).
            reject: (refusal) => {
              if (this.ended) return;
              this.specs.delete(taskId);
              this.taskLost(new TaskLostError(taskId, spec.numSamples, [], `submitted again, it was refused: ${refusal.message}`, refusal));
            },
            cancelled: false,
            refusedByPause: false,
          },
        ]);
        continue;
      }
      this.specs.delete(taskId);
      const why =
        spec.got.size > 0
          ? `${spec.got.size} of its ${spec.numSamples} samples had arrived, so it was not submitted again (a second run would mix two runs in its group)`
          : this.cancels.has(taskId)
            ? 'it was cancelled, so it was not submitted again'
            : 'it was owed from the session this one resumed, whose process may have had some of its samples, so it was not submitted again';
      this.taskLost(new TaskLostError(taskId, spec.numSamples, [...spec.got].sort((a, b) => a - b), why, err));
    }
  }

  private taskLost(e: TaskLostError): void {
    this.stats.tasksLost++;
    this.lostTasks.push(e);
    const handler = this.onTaskLost;
    // Not called inside grpc-js's event (an exception there would break the stream's bookkeeping).
    if (handler) queueMicrotask(() => this.notify('onTaskLost', handler, e));
  }

  /**
   * Calls one of the caller's callbacks. What it throws is reported as a process warning (`RolloutCallbackError`,
   * counted in `stats.callbackErrors`) and the session goes on: thrown inside grpc-js's event or a microtask, it would
   * break the stream's bookkeeping or crash the process (uncaughtException).
   */
  private notify<T>(name: string, handler: ((value: T) => void) | undefined, value: T): void {
    if (!handler) return;
    try {
      // An async callback (a `() => void` type takes one) fails by rejecting: unhandled, that rejection would end the
      // process (Node's default --unhandled-rejections=throw) as a throw here would.
      const result: unknown = handler(value);
      if (typeof (result as PromiseLike<unknown> | undefined)?.then === 'function') {
        (result as PromiseLike<unknown>).then(undefined, (err: unknown) => this.callbackFailed(name, err));
      }
    } catch (err) {
      this.callbackFailed(name, err);
    }
  }

  private callbackFailed(name: string, err: unknown): void {
    this.stats.callbackErrors++;
    const why = err instanceof Error ? err.message : String(err);
    const warning = new Error(`RolloutSession.${name} threw (ignored, the session goes on): ${why}`, { cause: err });
    warning.name = 'RolloutCallbackError';
    process.emitWarning(warning);
  }

  /** The server's address as the caller gave it (the channel's target without grpc-js's default `dns:` scheme). */
  private target(): string {
    return this.client.getChannel().getTarget().replace(/^dns:(\/\/\/)?/, '');
  }

  /**
   * A message no correct server sends (an answer to no spec, a sample outside its group, a trajectory of a task neither
   * accepted nor owed): ignored (a trajectory is neither delivered, counted nor acked), so what the session is owed
   * stays right; counted in `stats.protocolViolations` and said as a process warning (`RolloutProtocolWarning`), the
   * first {@link MAX_VIOLATION_WARNINGS} of the session (a server sending thousands must not flood the log).
   */
  private violation(what: string): void {
    this.stats.protocolViolations++;
    if (this.violationsWarned >= MAX_VIOLATION_WARNINGS) return;
    this.violationsWarned++;
    const more = this.violationsWarned === MAX_VIOLATION_WARNINGS ? ` (the last warned of; stats.protocolViolations counts the others)` : '';
    const warning = new Error(`rollout server ${this.target()} sent ${what}: ignored, a faulty server${more}`);
    warning.name = 'RolloutProtocolWarning';
    process.emitWarning(warning);
  }

  /**
   * A trajectory this stream had delivered already, sent again (not a re-sent one after a re-open: see
   * redeliveredAgain): dropped and not counted (the server does not owe it twice); acked again when it had been acked.
   */
  private sentTwice(ref: { taskId: string; sampleIndex: number }, key: string): void {
    this.stats.duplicatesDropped++;
    if (!this.heldHere.has(key) && !this.unacked.has(key)) this.writeAcks([ref]);
  }

  /**
   * A trajectory re-sent on a re-opened stream that this session had received before the break: counted (the server
   * counts it in `redelivered`) and dropped. Acked again if it had been acked (the ack may have died with the stream);
   * one still held here is acked when consumed (autoAck) or by the caller.
   */
  private redeliveredAgain(ref: { taskId: string; sampleIndex: number }, key: string): void {
    this.seen.add(key);
    this.received++;
    this.fromBefore++;
    this.stats.duplicatesDropped++;
    if (!this.heldHere.has(key) && !this.unacked.has(key)) this.writeAcks([ref]);
  }

  /**
   * The stream failed. A transport break is re-opened with resume (see {@link SessionOptions.reconnectForMs}) while
   * the budget of this outage lasts; anything else ends the session with the error.
   */
  private broke(err: ServiceError, openTimedOut = false): void {
    const code = (err as { code?: unknown }).code;
    // RESOURCE_EXHAUSTED ends a stream whose client took nothing for the server's sessions.stalledMs (the status, or
    // the RST_STREAM ENHANCE_YOUR_CALM after it): the session stays resumable. Not a message over a size limit ("...
    // message larger than max"): the server would send it again on every resume.
    const stalled = code === status.RESOURCE_EXHAUSTED && !/larger than max/i.test(err.details ?? '');
    const transient = code === status.UNAVAILABLE || code === status.INTERNAL || code === status.UNKNOWN || stalled || openTimedOut;
    const garbled = code === status.INTERNAL && /^Response message parsing error/.test(err.details ?? '');
    const healthy = this.openedAt !== undefined && performance.now() - this.openedAt >= HEALTHY_STREAM_MS;
    if (!garbled || healthy) this.garbledInRow = 0;
    if (garbled && ++this.garbledInRow >= MAX_GARBLED_STREAMS && this.reconnectForMs > 0 && !this.ended) {
      const why = `${err.details}: on ${this.garbledInRow} streams in a row (each re-opened with resume), so the server sends it on every resume`;
      return this.fail(Object.assign(new Error(`rollout stream failed: ${why}`, { cause: err }), { code: status.INTERNAL, details: why }), true);
    }
    if (code === status.RESOURCE_EXHAUSTED && /^Received message larger than max/.test(err.details ?? '') && !this.ended) {
      // Never re-opened (the server would send it again on every resume): said with the option to raise, as Python's.
      const why = `rollout server ${this.target()} sent a message over this client's maxReceiveMessageBytes (${err.details}): raise that RolloutClient option to at least the server's maxMessageBytes`;
      return this.fail(Object.assign(new Error(`rollout stream failed: ${why}`, { cause: err }), { code: status.RESOURCE_EXHAUSTED, details: why }), true);
    }
    // Stopped by the caller (abort(), a loop left early): CANCELLED, whatever the transport said meanwhile.
    if (this.ended) return this.fail(code === status.CANCELLED ? err : cancelled(err), true);
    // Broken after this session had received, consumed and acked everything and half-closed: the server closes a
    // session once all of it is acked, so a resume that finds it gone means done (only the final status was lost).
    if (code === status.NOT_FOUND && this.doneOnce) return this.fail(err, false);
    // The re-open found the session gone: opened afresh (resubmitLostTasks), within this outage's budget.
    const lost = code === status.NOT_FOUND && this.resubmitLost && this.reopenedWithResume && !this.isOpen;
    if (this.reconnectForMs === 0 || !(transient || lost)) return this.fail(err, true);
    if (lost) this.sessionLost(err);
    if (this.halfClosed && this.unacked.size === 0) this.doneOnce = true;
    const now = performance.now();
    // A stream that stayed up a while or delivered something new starts a new outage; one that breaks again without
    // (e.g. a server or proxy that opens and fails every stream, at once or a second later) stays in the old one, so
    // its backoff and budget go on - counted from the first break - instead of re-opening for ever.
    if (this.progressed || (this.openedAt !== undefined && now - this.openedAt >= HEALTHY_STREAM_MS)) this.outage = undefined;
    this.openedAt = undefined;
    if (!this.outage) {
      this.outage = new RetrySchedule(this.reconnectForMs);
      this.outageUntil = now + this.reconnectForMs;
    }
    this.outageError = err;
    const delay = this.outage.next();
    if (delay === undefined) return this.fail(err, true);
    this.connected = false;
    this.isOpen = false;
    this.halfClosed = false;
    // Their specs are written again on the re-opened stream (re-armed then); answers of the broken one never come.
    for (const list of this.pending.values()) for (const s of list) clearTimeout(s.answerTimer);
    this.unanswered.clear();
    this.deliveryHeld = false; // a pause is of the stream: the re-opened one is told again if the server still holds
    this.before ??= new Set();
    for (const key of this.seen) this.before.add(key);
    this.seen = new RecentKeys(this.seen.cap);
    this.streamTrajectories = 0;
    this.redeliveryLeft = 0;
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = undefined;
      if (this.ended) return;
      this.stats.reconnects++;
      try {
        this.reopen();
      } catch (e) {
        // grpc-js throws at once on a closed channel (RolloutClient.close() during the outage): the session ends.
        this.fail(e instanceof Error ? e : new Error(String(e)), true);
      }
    }, delay);
  }

  /**
   * Opens the session again on a new stream, owed what the server says (SessionOpened: re-sent + pending) plus what
   * the specs sent again bring; writes those specs (not answered: the server may never have had them) and the cancels.
   */
  private reopen(): void {
    this.openTasks.clear();
    this.expected = 0;
    this.received = 0;
    this.inherited = 0;
    this.fromBefore = 0;
    // Resumed once it was opened (or the caller resumes a predecessor's): a first open that never got its answer is
    // sent as it was (resuming a session the server never opened would be NOT_FOUND).
    this.reopenedWithResume = !this.fresh && (this.openedOnce || this.resumeFirst);
    this.attach(this.reopenedWithResume);
    // A re-open that never answers (a black-holed address, a server that accepts and says nothing) is bounded by the
    // outage's budget too, not only the re-opens that fail.
    const left = this.outageUntil - performance.now();
    // Sooner than openTimeoutMs (attach's timer, which re-opens again): the budget ends first.
    if (left < Math.min(MAX_TIMER_MS, this.openTimeoutMs)) {
      clearTimeout(this.openTimer);
      const call = this.call;
      this.openTimer = setTimeout(() => {
        this.openTimer = undefined;
        if (this.isOpen || this.ended || call !== this.call) return;
        this.fail(this.outageError ?? new Error('rollout stream could not be re-opened'), true);
        cancelCall(call);
      }, Math.max(0, left));
    }
    for (const list of this.pending.values()) {
      for (const s of list) {
        this.call.write(s.bytes);
        this.armAnswerTimer(s);
      }
    }
    for (const taskId of this.cancels) this.call.write({ kind: { $case: 'cancel', value: { taskId } } });
  }

  /** The session ends with `err` (`failed`: an error, else the server's end of the stream: iteration ends cleanly). */
  private fail(err: Error, failed: boolean): void {
    this.ended = true;
    this.connected = false;
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = undefined;
    clearTimeout(this.openTimer);
    this.openTimer = undefined;
    this.endedWith ??= err;
    this.closeListener?.();
    this.closeListener = undefined;
    this.rejectOpened(err);
    for (const waiters of this.pending.values()) {
      for (const w of waiters) {
        clearTimeout(w.answerTimer);
        w.reject(err);
      }
    }
    this.pending.clear();
    this.endRetries();
    this.queue.end(failed ? err : undefined);
  }

  /** Ends the session at once: the stream is cancelled, or, between a break and its re-open, the session fails now. */
  private stop(): void {
    this.ended = true;
    this.endRetries();
    if (this.connected) cancelCall(this.call);
    else this.fail(cancelled(this.endedWith), true);
  }

  /**
   * Queues a task; resolves when the server accepts it, rejects with TaskRejectedError naming the field. A temporary
   * refusal (`retryable`) is submitted again for up to `retryRejectedForMs` (see {@link SessionOptions}) before it
   * rejects. A spec that cannot be encoded (e.g. a bigint in `instance`) is rejected here, alone (field `instance`):
   * written to the stream, it would make grpc-js cancel the whole call. So is a spec over the channel's
   * `maxSendMessageBytes` (INVALID_ARGUMENT, naming the spec's largest field), which grpc-js would refuse by ending the
   * whole stream. After the stream ended, or after `close()`, rejects at once. With `submitTimeoutMs`, rejects with
   * a {@link SubmitTimeoutError} when the server does not answer the spec in time.
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
    if (this.maxSendBytes !== undefined && bytes.length > this.maxSendBytes) {
      // grpc-js would fail the write with RESOURCE_EXHAUSTED and end the whole stream with it (every other submit and
      // trajectory with it): refused here, alone, naming what to shrink.
      return Promise.reject(tooLarge(request.kind!.value as TaskSpec, bytes.length, this.maxSendBytes));
    }
    const numSamples = (request.kind!.value as TaskSpec).numSamples;
    return new Promise((resolve, reject) => this.send({ taskId: task.taskId, bytes, numSamples, resolve, reject, cancelled: false, refusedByPause: false }));
  }

  /**
   * Cancels a task: its unfinished samples end with status CANCELLED (and still arrive). A submit of it waiting to be
   * sent again after a temporary refusal is not: it rejects at once with that refusal (the task never ran).
   */
  cancel(taskId: string): void {
    for (const s of this.pending.get(taskId) ?? []) s.cancelled = true; // refused later: not sent again
    for (const s of [...this.retrying]) {
      if (s.taskId !== taskId) continue;
      if (s.tracked) this.specs.delete(taskId); // never ran: nothing to submit again
      this.dropRetry(s);
      s.reject(s.refusal!);
    }
    // Also cancelled again on a re-opened stream (this one may break before the server reads it).
    if (this.reconnectForMs > 0 && !this.ended) this.cancels.add(taskId);
    if (!this.ended && !this.halfClosed && this.connected) this.call.write({ kind: { $case: 'cancel', value: { taskId } } });
    this.maybeHalfClose();
  }

  /**
   * Acks every trajectory of these tasks the server has sent this session so far (samples not sent yet, e.g. held
   * while delivery is paused, are not covered and come later).
   */
  ackTasks(taskIds: string[]): void {
    if (this.halfClosed || this.ended) return;
    const step = this.maxAckEntries;
    // Between a break and its re-open not written: what the server re-sends of these tasks is acked then (it is no
    // longer held here: see redeliveredAgain).
    if (this.connected) {
      for (let i = 0; i < taskIds.length; i += step) this.call.write({ kind: { $case: 'ack', value: { taskIds: taskIds.slice(i, i + step), trajectories: [] } } });
    }
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
    this.writeAcks(refs);
    if (this.autoAck) {
      for (const r of refs) this.heldHere.delete(refKey(r.taskId, r.sampleIndex));
      return;
    }
    for (const r of refs) this.unacked.delete(refKey(r.taskId, r.sampleIndex));
    this.maybeHalfClose();
  }

  /**
   * Writes acks in parts of the server's bound. Between a break and its re-open they are not: the server re-sends
   * those trajectories, and a re-sent one this session no longer holds is acked then (see redeliveredAgain).
   */
  private writeAcks(refs: { taskId: string; sampleIndex: number }[]): void {
    if (!this.connected || this.halfClosed || this.ended) return;
    const step = this.maxAckEntries;
    for (let i = 0; i < refs.length; i += step) this.call.write({ kind: { $case: 'ack', value: { taskIds: [], trajectories: refs.slice(i, i + step) } } });
  }

  /**
   * No more submits. The stream is half-closed once every accepted sample has been received and consumed
   * (so the last acks still reach the server); the server then ends it and iteration finishes.
   *
   * That wait has no bound of its own: nothing here tells a slow task from a server that claims a task and never sends
   * it. `signal` bounds it (e.g. `AbortSignal.timeout(ms)`): if it fires before the stream is half-closed, the session
   * ends at once - iteration yields what it holds, then fails with an error (`code` DEADLINE_EXCEEDED for a timeout,
   * else CANCELLED; the signal's reason as `cause`) naming what was still owed: the tasks and their missing samples,
   * trajectories owed from before this stream, submits without an answer, and what the caller had not consumed or
   * acked. The call is cancelled; the session stays resumable on the server.
   *
   * @example
   * session.close({ signal: AbortSignal.timeout(30 * 60_000) });
   */
  close(options: { signal?: AbortSignal } = {}): void {
    this.closing = true;
    const { signal } = options;
    if (signal && !this.ended) {
      this.closeListener?.();
      const onAbort = (): void => this.closeAborted(signal.reason);
      if (signal.aborted) return onAbort();
      signal.addEventListener('abort', onAbort, { once: true });
      this.closeListener = () => signal.removeEventListener('abort', onAbort);
    }
    this.maybeHalfClose();
  }

  /** The signal given to close() fired: the session ends now, with what it was still owed in its error. */
  private closeAborted(reason: unknown): void {
    this.closeListener = undefined;
    if (this.ended || this.halfClosed) return; // ended already, or everything came
    const timedOut = (reason as { name?: unknown } | undefined)?.name === 'TimeoutError';
    const err = new Error(`rollout session closed (its close signal fired${timedOut ? ': timed out' : ''}) before it had everything: ${this.outstanding()}`, {
      cause: reason,
    });
    Object.assign(err, { code: timedOut ? status.DEADLINE_EXCEEDED : status.CANCELLED });
    const connected = this.connected;
    this.fail(err, true);
    if (connected) cancelCall(this.call);
  }

  /** What keeps the session from ending, for an error: what the server owes, then what the caller has not done. */
  private outstanding(): string {
    const parts: string[] = [];
    const shown = 20;
    let missing = 0;
    const tasks: string[] = [];
    for (const [taskId, task] of this.openTasks) {
      const lacking: number[] = [];
      for (let i = 0; i < task.numSamples && lacking.length <= 10; i++) if (!task.got.has(i)) lacking.push(i);
      missing += task.numSamples - task.got.size;
      const list = lacking.length > 10 ? `${lacking.slice(0, 10).join(', ')}, ...` : lacking.join(', ');
      if (tasks.length < shown) tasks.push(`${taskId} (samples ${list} of ${task.numSamples})`);
    }
    if (tasks.length > 0) parts.push(`task ${tasks.join('; ')}${this.openTasks.size > shown ? `; and ${this.openTasks.size - shown} more tasks` : ''}`);
    const earlier = this.inherited + this.expected - this.received - missing;
    if (earlier > 0) parts.push(`${earlier} trajectories owed from before this stream`);
    const unanswered = [...this.pending.keys()];
    if (unanswered.length > 0) parts.push(`no answer yet to the spec of ${unanswered.slice(0, shown).join(', ')}${unanswered.length > shown ? ` and ${unanswered.length - shown} more` : ''}`);
    if (this.retrying.size > 0) parts.push(`${this.retrying.size} submits waiting to be sent again after a refusal`);
    if (!this.connected) parts.push('the stream was broken and not re-opened yet');
    else if (!this.isOpen) parts.push('the server had not answered the session\'s open');
    const owed = parts.length > 0 ? `still owed by the server: ${parts.join('; ')}` : 'nothing owed by the server';
    const caller: string[] = [];
    if (this.pushed > this.consumed) caller.push(`${this.pushed - this.consumed} trajectories not consumed yet`);
    if (this.unacked.size > 0) caller.push(`${this.unacked.size} trajectories not acked yet (autoAck off)`);
    return caller.length > 0 ? `${owed}; ${caller.join(', ')}` : owed;
  }

  /** Drops the stream at once (the session stays resumable on the server for a while). */
  abort(): void {
    this.stop();
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
      if (!finished && !this.ended) this.stop();
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
    if (this.resubmitLost && !this.specs.has(s.taskId)) {
      this.specs.set(s.taskId, { bytes: s.bytes, asked: s.numSamples, numSamples: 0, got: new Set(), unknown: false });
      s.tracked = true;
    }
    const list = this.pending.get(s.taskId) ?? [];
    list.push(s);
    this.pending.set(s.taskId, list);
    this.flow();
    // Between a break and its re-open: written on the re-opened stream with every other submit not answered.
    if (this.connected) {
      this.call.write(s.bytes);
      this.armAnswerTimer(s);
    }
  }

  /** The spec of `s` was written: the server has submitTimeoutMs to answer it. */
  private armAnswerTimer(s: Submission): void {
    clearTimeout(s.answerTimer);
    s.answerTimer = undefined;
    if (this.submitTimeoutMs >= MAX_TIMER_MS) return; // Infinity (the default): no bound
    s.answerTimer = setTimeout(() => this.answerTimedOut(s), this.submitTimeoutMs);
  }

  /**
   * No answer to the spec of `s` within submitTimeoutMs: it rejects with a SubmitTimeoutError, and the task is
   * cancelled on the server (it may have been accepted, its answer lost or late). The session goes on.
   */
  private answerTimedOut(s: Submission): void {
    s.answerTimer = undefined;
    const list = this.pending.get(s.taskId);
    const i = list?.indexOf(s) ?? -1;
    if (!list || i < 0 || this.ended) return;
    // Timers run in the order the specs were written (one duration): this is the first of its task still waiting.
    list.splice(i, 1);
    if (list.length === 0) this.pending.delete(s.taskId);
    this.unanswered.set(s.taskId, (this.unanswered.get(s.taskId) ?? 0) + 1);
    if (s.tracked) this.specs.delete(s.taskId); // not submitted again if the session is lost: the caller was told
    this.leavePauseWait(s);
    if (this.reconnectForMs > 0) this.cancels.add(s.taskId); // cancelled again on a re-opened stream
    if (this.connected && !this.halfClosed) this.call.write({ kind: { $case: 'cancel', value: { taskId: s.taskId } } });
    this.flow();
    s.reject(new SubmitTimeoutError(s.taskId, this.submitTimeoutMs));
    this.maybeHalfClose();
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
    if (!this.closing || !this.isOpen || !this.connected || this.halfClosed || this.ended || this.pending.size > 0 || this.retrying.size > 0) return;
    // Checked after every trajectory consumed: kept O(1) with running counts.
    const expected = this.inherited + this.expected;
    if (this.received < expected || this.consumed < this.pushed) return;
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
      this.fromBefore++;
      return;
    }
    if (task.got.has(t.sampleIndex)) return;
    task.got.add(t.sampleIndex);
    this.received++;
    if (task.got.size >= task.numSamples) {
      this.openTasks.delete(t.taskId);
      this.cancels.delete(t.taskId); // done: nothing left to cancel
    }
  }

  /** Answers the first submit of `taskId` still waiting for an answer, unless `retried` takes it back (a refusal for now). */
  private settle(taskId: string, fn: (p: Submission) => void, retried?: (p: Submission) => boolean): void {
    const late = this.unanswered.get(taskId);
    if (late !== undefined) {
      // The answer to a submit that timed out (see unanswered): not the next submit's. An `accepted` was counted.
      if (late > 1) this.unanswered.set(taskId, late - 1);
      else this.unanswered.delete(taskId);
      return;
    }
    const list = this.pending.get(taskId);
    const first = list?.shift();
    if (list && list.length === 0) this.pending.delete(taskId);
    clearTimeout(first?.answerTimer);
    if (first && retried?.(first)) return this.flow();
    if (first) this.progressed = true; // answered for good (a refusal for now is no progress)
    if (first) this.leavePauseWait(first);
    this.flow();
    if (first) fn(first);
  }

  /**
   * Pauses reading the call while `highWater` trajectories wait unread - but never while a submit waits for its answer:
   * `accepted` travels on the same call behind the trajectories, and a trainer that submits its batch (awaiting each
   * submit) before it reads would wait for ever. Unread trajectories are unacked, so the server's own bound
   * (sessions.maxUnackedBytes) still bounds what the queue can hold while reading goes on. Nor before the stream's
   * SessionOpened has come: a stream re-opened (reconnectForMs) while the consumer is busy with a full queue would
   * otherwise never read it, time out (openTimeoutMs) and be re-opened until the outage's budget was spent - the
   * session failing over a training step. What the server re-sends may come before it (Session.attach writes those
   * first); had here already, they are dropped, not queued: what is queued before it is what the broken stream had
   * in flight. A stream that queues highWater more trajectories before it is paused as usual, so a server that floods
   * without opening cannot grow the queue past twice highWater.
   */
  private flow(full: boolean = this.full): void {
    this.full = full;
    // A submit waiting for its retry waits for an answer too (and acks early what arrives while delivery is paused).
    const pause = full && (this.isOpen || this.queuedBeforeOpen >= this.highWater) && this.pending.size === 0 && this.retrying.size === 0;
    if (pause === this.paused) return;
    this.paused = pause;
    if (pause) this.call.pause();
    else this.call.resume();
  }
}

function refKey(taskId: string, sampleIndex: number): string {
  return `${sampleIndex}\u0000${taskId}`;
}

/** The error of a session the caller stopped (as grpc-js reports a cancelled call: `code` CANCELLED). */
function cancelled(cause: Error | undefined): Error {
  return Object.assign(new Error('rollout session cancelled by the client', { cause }), { code: status.CANCELLED });
}

/** `reconnectForMs` as given, checked: a non-negative number of milliseconds (Infinity: for as long as it takes). */
/**
 * The refusal of a spec whose request (`size` bytes) is over the channel's send bound, naming the spec's largest
 * top-level field (what to shrink), as the Python client's TaskTooLargeError does.
 */
function tooLarge(spec: TaskSpec, size: number, limit: number): TaskRejectedError {
  let field = 'instance';
  let fieldSize = 0;
  for (const key of Object.keys(spec) as (keyof TaskSpec)[]) {
    const alone: TaskSpec = { ...TaskSpec.fromPartial({}), [key]: spec[key] };
    const bytes = TaskSpec.encode(alone).finish().length;
    if (bytes > fieldSize) [field, fieldSize] = [snakeCase(key), bytes];
  }
  const reason = `the task spec is ${size} bytes, over the ${limit}-byte limit of this client's channel (maxSendMessageBytes); ${field} is ${fieldSize} bytes`;
  return new TaskRejectedError(spec.taskId, field, reason, status.INVALID_ARGUMENT);
}

function snakeCase(name: string): string {
  return name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}

/**
 * Default deadline (ms) of the unary calls a server answers at once (cancel, listEnvironments, listBackends, addBackend,
 * removeBackend without drain), and of a session's open (SessionOptions.openTimeoutMs): a server that takes the call and
 * never answers fails it (DEADLINE_EXCEEDED) instead of leaving
 * the caller waiting for ever. Generous: a loaded server answers these in milliseconds.
 */
const QUICK_CALL_MS = 60_000;

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
  /**
   * Largest message this client sends (grpc `max_send_message_length`; default: no bound, as grpc-js). A task spec over
   * it is refused by `submit()` alone (TaskRejectedError naming the spec's largest field) instead of being written:
   * grpc-js would end the whole stream on it. (The server's own bound - 4 × its `maxMessageBytes` on the transport -
   * is not known here.)
   */
  maxSendMessageBytes?: number;
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
  private readonly maxSendMessageBytes: number | undefined;
  /** Unary calls and watches in flight: close() cancels them (the channel alone would let them run to their deadlines). */
  private readonly inFlight = new Set<{ cancel(): void }>();
  private closed = false;

  constructor(address: string, options: ConnectionOptions = {}) {
    const keepaliveMs = options.keepalive?.timeMs ?? 30_000;
    this.maxSendMessageBytes = options.maxSendMessageBytes;
    const opts = {
      'grpc.max_receive_message_length': options.maxReceiveMessageBytes ?? 256 << 20,
      // grpc-js waits between connection attempts 1 s growing 1.6x to 120 s, and fails a call at once meanwhile: after a
      // minute of outage the server would be tried again only every ~20-120 s, so a session re-opening a broken stream
      // (reconnectForMs) could spend its budget while the server was back. Attempts at most RETRY_CAP_MS apart, as the
      // re-opens themselves; a connection attempt to a server that is down costs next to nothing.
      'grpc.max_reconnect_backoff_ms': RETRY_CAP_MS,
      ...(options.maxSendMessageBytes !== undefined && { 'grpc.max_send_message_length': options.maxSendMessageBytes }),
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
    return new RolloutSession(this.rollout, options, this.maxSendMessageBytes);
  }

  /**
   * Submits one task (unary). `deadlineMs`: how long to wait for the answer (DEADLINE_EXCEEDED after it); default no
   * bound, because a full server answers only once it has room for the task (admission is how it pushes back).
   */
  submit(task: TaskInput, options: { deadlineMs?: number } = {}): Promise<{ taskId: string; numSamples: number; duplicate: boolean }> {
    const deadline = callDeadline(options.deadlineMs ?? Infinity);
    return this.unary((cb) => this.rollout.submit({ task: TaskSpec.fromPartial({ numSamples: 1, ...task }) }, new Metadata(), { deadline }, cb));
  }

  getTrajectory(taskId: string, options: { sampleIndex?: number; wait?: boolean; deadlineMs?: number } = {}): Promise<GetTrajectoryResponse> {
    const deadline = callDeadline(options.deadlineMs ?? 600_000);
    return this.unary((cb) =>
      this.rollout.getTrajectory({ taskId, wait: options.wait ?? false, ...(options.sampleIndex !== undefined && { sampleIndex: options.sampleIndex }) }, new Metadata(), { deadline }, cb),
    );
  }

  /** Cancels a task. `deadlineMs` (default {@link QUICK_CALL_MS}): a server that never answers fails the call. */
  cancel(taskId: string, options: { deadlineMs?: number } = {}): Promise<{ cancelled: number }> {
    const deadline = callDeadline(options.deadlineMs ?? QUICK_CALL_MS);
    return this.unary((cb) => this.rollout.cancel({ taskId }, new Metadata(), { deadline }, cb));
  }

  /** The server's environments. `deadlineMs` (default {@link QUICK_CALL_MS}): a server that never answers fails the call. */
  listEnvironments(options: { deadlineMs?: number } = {}): Promise<ListEnvironmentsResponse> {
    const deadline = callDeadline(options.deadlineMs ?? QUICK_CALL_MS);
    return this.unary((cb) => this.rollout.listEnvironments({}, new Metadata(), { deadline }, cb));
  }

  /**
   * Dashboard tail; iterate, and leave the loop (`break`, `return`, a throw) or call `cancel()` to stop: either cancels
   * the call, so the server frees its `watch.maxOpen` slot and the channel holds no call open.
   */
  watch(request: Partial<WatchRequest> = {}): AsyncIterable<WatchResponse> & { cancel: () => void } {
    const call = this.rollout.watch({ environments: [], groupIds: [], fullTrajectories: false, stageEvents: false, statsIntervalMs: 0, ...request });
    const queue = new AsyncQueue<WatchResponse>(1024, () => call.pause(), () => call.resume());
    this.inFlight.add(call);
    call.on('data', (m: WatchResponse) => queue.push(m));
    call.on('error', (err: ServiceError) => queue.end(err.code === 1 ? undefined : err));
    call.on('end', () => queue.end());
    call.on('status', () => this.inFlight.delete(call));
    if (this.closed) cancelCall(call);
    const cancel = (): void => cancelCall(call);
    return {
      cancel,
      [Symbol.asyncIterator]: (): AsyncIterator<WatchResponse> => {
        const it = queue[Symbol.asyncIterator]();
        return {
          next: () => it.next(),
          // A loop left early: the queue alone would stop taking messages while the call went on reading them, holding
          // the server's slot until the connection closed (and keeping the process alive).
          return: () => {
            cancel();
            return it.return!();
          },
        };
      },
    };
  }

  /**
   * Adds an engine. `deadlineMs` (default {@link QUICK_CALL_MS}): a server that never answers fails the call
   * (DEADLINE_EXCEEDED). The server answers once it learned what the engine says about itself, within its own
   * modelInfoTimeoutMs and before this deadline; a call that ends without an answer adds nothing (a retry is not
   * ALREADY_EXISTS).
   */
  addBackend(request: Partial<AddBackendRequest> & { url: string }, options: { deadlineMs?: number } = {}): Promise<Backend | undefined> {
    const deadline = callDeadline(options.deadlineMs ?? QUICK_CALL_MS);
    return this.unary<{ backend?: Backend | undefined }>((cb) =>
      this.backends.addBackend({ kind: 0, maxConcurrency: 0, id: '', model: '', logprobsMode: 0, checkAnswerId: false, ...request }, new Metadata(), { deadline }, cb),
    ).then((r) => r.backend);
  }

  /** The server's backends. `deadlineMs` (default {@link QUICK_CALL_MS}): a server that never answers fails the call. */
  listBackends(options: { deadlineMs?: number } = {}): Promise<Backend[]> {
    const deadline = callDeadline(options.deadlineMs ?? QUICK_CALL_MS);
    return this.unary<{ backends: Backend[] }>((cb) => this.backends.listBackends({}, new Metadata(), { deadline }, cb)).then((r) => r.backends);
  }

  /**
   * Removes an engine; with `drain`, once its requests in flight have finished. `deadlineMs`: a server that never
   * answers fails the call (DEADLINE_EXCEEDED); default {@link QUICK_CALL_MS}, or 10 min with `drain` (as
   * pauseGeneration's, which waits for requests in flight too).
   */
  removeBackend(id: string, drain = false, options: { deadlineMs?: number } = {}): Promise<void> {
    const deadline = callDeadline(options.deadlineMs ?? (drain ? 600_000 : QUICK_CALL_MS));
    return this.unary((cb) => this.backends.removeBackend({ id, drain }, new Metadata(), { deadline }, cb)).then(() => undefined);
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
    return this.unary<{ backends: Backend[] }>((cb) =>
      this.backends.pauseGeneration({ backendId: options.backendId ?? '', mode }, new Metadata(), { deadline }, cb),
    ).then((r) => r.backends);
  }

  /**
   * Resumes generation (every engine, or `backendId`), recording the policy version they serve from now on when given.
   * `deadlineMs` (default 10 min, as pauseGeneration's): a server that never answers
   * fails the call.
   */
  resumeGeneration(options: { backendId?: string; policyVersion?: number; deadlineMs?: number } = {}): Promise<Backend[]> {
    const deadline = callDeadline(options.deadlineMs ?? 600_000);
    return this.unary<{ backends: Backend[] }>((cb) =>
      this.backends.resumeGeneration(
        { backendId: options.backendId ?? '', ...(options.policyVersion !== undefined && { policyVersion: options.policyVersion }) },
        new Metadata(),
        { deadline },
        cb,
      ),
    ).then((r) => r.backends);
  }

  /**
   * Closes the channels. Unary calls still in flight (a `getTrajectory` with `wait`, a `submit` waiting for room) reject
   * with CANCELLED saying the client was closed, and watches end, instead of running to their deadlines (10 min for
   * `getTrajectory`, none for `submit`) and keeping the process alive meanwhile; a call made after it rejects at once.
   * Sessions are not ended by it: close or abort them first.
   */
  close(): void {
    this.closed = true;
    for (const call of [...this.inFlight]) cancelCall(call);
    this.inFlight.clear();
    this.rollout.close();
    this.backends.close();
  }

  /** A unary call through `start`, tracked until it ends (see {@link close}). */
  private unary<T>(start: (cb: (err: ServiceError | null, value?: T) => void) => { cancel(): void }): Promise<T> {
    if (this.closed) return Promise.reject(clientClosed());
    return new Promise((resolve, reject) => {
      let ended = false;
      const call = start((err, value) => {
        ended = true;
        this.inFlight.delete(call);
        if (err) reject(this.closed && err.code === status.CANCELLED ? clientClosed(err) : err);
        else resolve(value as T);
      });
      if (!ended) this.inFlight.add(call);
    });
  }
}

/** The error of a unary call the client's close() cut short (or made after it). */
function clientClosed(cause?: ServiceError): Error {
  const details = 'the RolloutClient was closed while the call was in flight (or before it was made)';
  return Object.assign(new Error(`${status.CANCELLED} CANCELLED: ${details}`, cause && { cause }), { code: status.CANCELLED, details, metadata: new Metadata() });
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
