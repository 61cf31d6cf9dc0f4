import { status as grpcStatus, type ServiceError } from '@grpc/grpc-js';
import { TaskRejectedError, type RolloutClient, type RolloutSession, type TaskInput } from '../../src/client/rollout-client.js';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { benchTask, statusName } from '../drive.js';

/** Where one submitted task ended up, as the client knows it; every task ends in exactly one of these. */
export type TaskState =
  /** Written on a stream; neither accepted nor rejected yet. */
  | 'sent'
  | 'accepted'
  /** Every sample's trajectory received (statuses counted separately). */
  | 'finished'
  | 'rejected'
  /** Accepted, then the server restarted and says it does not know the task (GetTrajectory NOT_FOUND). */
  | 'lost'
  /** Accepted and never delivered, though the server did not say it lost it (a bug, if ever non-zero). */
  | 'missing';

interface TaskRecord {
  session: number;
  n: number;
  state: TaskState;
  submittedAt: number;
  /** Sample indices received (once each). */
  received: Set<number>;
  /** Accepted by the server that was killed (its fate is the journal's to decide). */
  acceptedBeforeKill: boolean;
  /** Submitted before the kill, finished after it: excluded from latency percentiles. */
  spansKill: boolean;
  /** When the `accepted` answer arrived (undefined until then). */
  acceptedAt: number | undefined;
  /** Where the client's ack of each sample was written (by sample index): stream number and position on it. */
  acks: Map<number, WrittenAt>;
  /** Where the task was last written (to tell, from its answer, how far the server had read that stream). */
  submitted: WrittenAt | undefined;
}

/**
 * A request's place on the client's side of a stream: the stream (numbered across reconnects) and its position
 * among the requests written on it. The server reads a stream's requests in order, so once it has answered a task
 * written at position p, it has read everything written before p on that stream — acks included.
 */
interface WrittenAt {
  stream: number;
  seq: number;
}

/** Attempts to (re)open a session, a second apart, before it waits for the next server. */
const ATTACH_RETRIES = 30;

export interface LoadOptions {
  sessions: number;
  /** Samples kept in flight across all sessions. */
  concurrency: number;
  groupSize: number;
  /** Every k-th task is `math` (python tool in bubblewrap); the rest are `soak-calc` (null sandbox). */
  sandboxEvery: number;
  calcEnvironment: string;
  /** Task id prefix (unique per run, so a journal of an earlier run never answers "duplicate"). */
  prefix: string;
}

export interface LoadCounts {
  tasksSubmitted: number;
  byState: Record<TaskState, number>;
  samplesExpected: number;
  trajectoriesReceived: number;
  statuses: Record<string, number>;
  byEnvironment: Record<string, number>;
  /**
   * A trajectory received again although the server had provably read the client's ack of it: the ack was written
   * on a live stream before a task the server then answered (it reads a stream in order). A bug if non-zero.
   */
  duplicatesAfterAck: number;
  /**
   * A trajectory received again whose ack was written on the killed stream but not provably read by the server
   * before the kill (queued behind requests it had not read yet, or in the socket): allowed, the server never saw it.
   */
  redeliveredAckUnread: number;
  /** A trajectory received again whose ack was written on a live stream, not provably read yet (no kill in between). */
  redeliveredAckInFlight: number;
  /** Tasks accepted and unfinished when the server was killed (what the journal must run again or report). */
  acceptedInFlightAtKill: number;
  /** Trajectories of task ids this client never submitted. */
  unknownTrajectories: number;
  /** Trajectories whose token arrays disagree (mask, logprobs and response ids not of one length). */
  malformedTrajectories: number;
  /** Tasks re-sent after a reconnect because no accepted/rejected had arrived for them. */
  resubmitted: number;
  /** Re-sent tasks the server answered with duplicate = true (it had them). */
  resubmitDuplicates: number;
  rejectReasons: Record<string, number>;
  /** Means of the server's Trajectory.timing over received trajectories, ms. */
  meanTimingMs: Record<'queue' | 'init' | 'llm' | 'tool' | 'eval' | 'total', number>;
  /** Task ids lost or missing (first few), to look up. */
  examples: string[];
  errorsOfFailedTrajectories: string[];
}

export interface ReconnectNote {
  session: number;
  resumed: boolean;
  redelivered: number;
  pending: number;
  /** Why resume was refused, when it was. */
  refused?: string;
}

/**
 * The soak's trainer: `sessions` Rollout streams that together keep `concurrency` samples in flight, submitting
 * a new task as soon as one finishes and acking every trajectory as it is taken (the client's autoAck). When the
 * server goes away it waits for {@link reconnect}, reopens each session with `resume: true`, re-sends only the
 * tasks it was never told were accepted or rejected, and accounts for every task exactly once.
 */
export class SoakLoad {
  /** Submit → trajectory, per trajectory of a task that did not span the kill. */
  readonly latenciesMs: number[] = [];
  /** Submit → `accepted` (the server read, validated and admitted the task), per task not spanning the kill. */
  readonly acceptMs: number[] = [];
  /**
   * Accepted → received minus the server's own Trajectory.timing.totalMs (admission → handed to the stream): the
   * time a finished trajectory took to reach the client (stream outbox, transport, the client's loop).
   */
  readonly deliveryMs: number[] = [];
  readonly reconnects: ReconnectNote[] = [];
  private readonly tasks = new Map<string, TaskRecord>();
  private readonly workers: SessionWorker[];
  private nextTask = 0;
  private client: RolloutClient;
  private submitting = true;
  private killedAt: number | undefined;
  private acceptedAtKill = 0;
  /** For each stream open at the kill: the furthest position the server had provably read. */
  private readonAtKill = new Map<number, number>();
  /** Numbers streams across sessions and reconnects. */
  private streams = 0;
  /** Bumped by every reconnect; a session that broke on generation g waits for g + 1. */
  private generation = 0;
  private wake: { promise: Promise<void>; resolve: () => void } = deferred();
  readonly counts = {
    received: 0,
    duplicatesAfterAck: 0,
    redeliveredAckUnread: 0,
    redeliveredAckInFlight: 0,
    unknown: 0,
    malformed: 0,
    resubmitted: 0,
    resubmitDuplicates: 0,
    statuses: {} as Record<string, number>,
    byEnvironment: {} as Record<string, number>,
    rejectReasons: {} as Record<string, number>,
    errors: [] as string[],
    /** Sums of the server's own Trajectory.timing over received trajectories, ms. */
    timing: { queue: 0, init: 0, llm: 0, tool: 0, eval: 0, total: 0 },
  };

  constructor(
    client: RolloutClient,
    readonly o: LoadOptions,
  ) {
    this.client = client;
    const perSession = Math.floor(o.concurrency / o.sessions);
    this.workers = Array.from({ length: o.sessions }, (_, i) => new SessionWorker(this, i, perSession + (i < o.concurrency % o.sessions ? 1 : 0)));
  }

  /** Samples in flight now (sent or accepted, not finished), summed over sessions. */
  get inflight(): number {
    return this.workers.reduce((sum, w) => sum + w.inflight, 0);
  }

  get received(): number {
    return this.counts.received;
  }

  /** Runs every session until {@link finish} and then until each has nothing in flight (or `drainTimeoutMs`). */
  run(): Promise<void> {
    return Promise.all(this.workers.map((w) => w.run())).then(() => undefined);
  }

  /** The server was killed: every stream is about to fail; sessions wait for {@link reconnect}. */
  serverKilled(): void {
    this.killedAt = performance.now();
    for (const w of this.workers) if (w.stream !== undefined) this.readonAtKill.set(w.stream, w.readUpTo);
    for (const record of this.tasks.values()) {
      if (record.state !== 'accepted') continue;
      record.acceptedBeforeKill = true;
      this.acceptedAtKill++;
    }
  }

  /** The restarted server is up: sessions resume on this client. */
  reconnect(client: RolloutClient): void {
    this.client = client;
    this.generation++;
    this.wakeAll();
  }

  private wakeAll(): void {
    const { resolve } = this.wake;
    this.wake = deferred();
    resolve();
  }

  /** Stops submitting; sessions end once what they have in flight is delivered, or after `drainTimeoutMs`. */
  finish(drainTimeoutMs: number): void {
    this.submitting = false;
    for (const w of this.workers) w.finish(drainTimeoutMs, () => this.wakeAll());
  }

  /** The accounting: every task submitted in exactly one state. */
  tally(): LoadCounts {
    const byState: Record<TaskState, number> = { sent: 0, accepted: 0, finished: 0, rejected: 0, lost: 0, missing: 0 };
    let samplesExpected = 0;
    const examples: string[] = [];
    for (const [id, record] of this.tasks) {
      byState[record.state]++;
      samplesExpected += record.n;
      if (record.state !== 'finished' && record.state !== 'rejected' && examples.length < 10) examples.push(`${id}:${record.state}`);
    }
    const c = this.counts;
    return {
      tasksSubmitted: this.tasks.size,
      byState,
      samplesExpected,
      trajectoriesReceived: c.received,
      statuses: c.statuses,
      byEnvironment: c.byEnvironment,
      duplicatesAfterAck: c.duplicatesAfterAck,
      redeliveredAckUnread: c.redeliveredAckUnread,
      redeliveredAckInFlight: c.redeliveredAckInFlight,
      acceptedInFlightAtKill: this.acceptedAtKill,
      unknownTrajectories: c.unknown,
      malformedTrajectories: c.malformed,
      resubmitted: c.resubmitted,
      resubmitDuplicates: c.resubmitDuplicates,
      rejectReasons: c.rejectReasons,
      meanTimingMs: Object.fromEntries(Object.entries(c.timing).map(([k, v]) => [k, c.received > 0 ? v / c.received : NaN])) as LoadCounts['meanTimingMs'],
      examples,
      errorsOfFailedTrajectories: c.errors,
    };
  }

  // ---- used by the session workers ----

  current(): { client: RolloutClient; generation: number } {
    return { client: this.client, generation: this.generation };
  }

  /** Resolves once a client newer than `generation` is there (or the drain gave up: check `drained`). */
  async waitForReconnect(generation: number, drained: () => boolean): Promise<void> {
    while (this.generation <= generation && !drained()) await this.wake.promise;
  }

  /** Tasks of one session in a state (scanned: only used after a restart and at the end). */
  *tasksOf(session: number, states: readonly TaskState[]): Generator<[string, TaskRecord]> {
    for (const entry of this.tasks) if (entry[1].session === session && states.includes(entry[1].state)) yield entry;
  }

  get open(): boolean {
    return this.submitting;
  }

  newTask(session: number): { taskId: string; input: TaskInput; n: number } {
    const i = this.nextTask++;
    const taskId = `${this.o.prefix}-${i}`;
    const environment = i % this.o.sandboxEvery === this.o.sandboxEvery - 1 ? 'math' : this.o.calcEnvironment;
    const input = benchTask(taskId, environment, this.o.groupSize, 1_000_000 + i);
    this.tasks.set(taskId, { session, n: this.o.groupSize, state: 'sent', submittedAt: performance.now(), received: new Set(), acceptedBeforeKill: false, spansKill: false, acks: new Map(), acceptedAt: undefined, submitted: undefined });
    return { taskId, input, n: this.o.groupSize };
  }

  /** The same task again (same id and spec): sent after a reconnect when its answer never came. */
  taskAgain(taskId: string): TaskInput {
    const i = Number(taskId.slice(this.o.prefix.length + 1));
    const environment = i % this.o.sandboxEvery === this.o.sandboxEvery - 1 ? 'math' : this.o.calcEnvironment;
    this.counts.resubmitted++;
    return benchTask(taskId, environment, this.o.groupSize, 1_000_000 + i);
  }

  record(taskId: string): TaskRecord | undefined {
    return this.tasks.get(taskId);
  }

  newStream(): number {
    return ++this.streams;
  }

  /**
   * One trajectory taken off a stream; `ack` is where its ack is written (the caller writes it right after).
   * Returns the task's sample count when this trajectory completed it, else 0.
   */
  onTrajectory(t: Trajectory, ack: WrittenAt): number {
    const record = this.tasks.get(t.taskId);
    const c = this.counts;
    if (!record) {
      c.unknown++;
      return 0;
    }
    const now = performance.now();
    const earlier = record.acks.get(t.sampleIndex);
    record.acks.set(t.sampleIndex, ack);
    if (earlier !== undefined) {
      const readOn = this.readonAtKill.get(earlier.stream);
      const worker = this.workers[record.session]!;
      if (readOn !== undefined) {
        if (earlier.seq < readOn) c.duplicatesAfterAck++;
        else c.redeliveredAckUnread++;
      } else if (worker.stream === earlier.stream && earlier.seq >= worker.readUpTo) c.redeliveredAckInFlight++;
      else c.duplicatesAfterAck++;
      return 0;
    }
    record.received.add(t.sampleIndex);
    c.received++;
    const s = statusName(t.status);
    c.statuses[s] = (c.statuses[s] ?? 0) + 1;
    c.byEnvironment[t.environment] = (c.byEnvironment[t.environment] ?? 0) + 1;
    if (s !== 'COMPLETED' && c.errors.length < 5) c.errors.push(`${t.taskId}: ${s} ${t.error}`);
    if (t.timing) {
      const sum = c.timing;
      sum.queue += t.timing.queueMs;
      sum.init += t.timing.initMs;
      sum.llm += t.timing.llmMs;
      sum.tool += t.timing.toolMs;
      sum.eval += t.timing.evalMs;
      sum.total += t.timing.totalMs;
    }
    if (t.responseMask.length !== t.responseTokenIds.length || t.responseLogprobs.length !== t.responseTokenIds.length) c.malformed++;
    if (this.killedAt !== undefined && record.submittedAt < this.killedAt) record.spansKill = true;
    if (!record.spansKill) {
      this.latenciesMs.push(now - record.submittedAt);
      if (record.acceptedAt !== undefined && t.timing) this.deliveryMs.push(now - record.acceptedAt - t.timing.totalMs);
    }
    if (record.received.size < record.n) return 0;
    record.state = 'finished';
    return record.n;
  }
}

/** One Rollout session of the load, across reconnects. */
export class SessionWorker {
  /** Samples of this session's tasks sent or accepted and not finished. */
  inflight = 0;
  /** The current stream's number, and how many requests were written on it. */
  stream: number | undefined;
  private seq = 0;
  /** The furthest position on the current stream the server has provably read (it answered a task written there). */
  readUpTo = 0;
  private session: RolloutSession | undefined;
  /** Tasks written on the current stream with no accepted/rejected yet. */
  private readonly unanswered = new Set<string>();
  /** Tasks to re-send on the next stream (their answer was lost with the old one). */
  private resend: string[] = [];
  private drainTimer: NodeJS.Timeout | undefined;
  private drained = false;
  private readonly id: string;

  constructor(
    private readonly load: SoakLoad,
    private readonly index: number,
    private readonly target: number,
  ) {
    this.id = `${load.o.prefix}-session-${index}`;
  }

  finish(drainTimeoutMs: number, wake: () => void): void {
    this.drainTimer = setTimeout(() => {
      this.drained = true;
      this.session?.abort();
      wake();
    }, drainTimeoutMs);
    this.maybeClose();
  }

  async run(): Promise<void> {
    let resume = false;
    let refusals = 0;
    for (;;) {
      const { client, generation } = this.load.current();
      const stream = await this.attach(client, resume);
      if (stream === undefined && resume && refusals < ATTACH_RETRIES && !this.drained) {
        // Refused (e.g. the server still thinks the old stream attached) or not reachable yet: try again shortly;
        // a reconnect meanwhile is picked up by current() above.
        refusals++;
        await new Promise((resolve) => setTimeout(resolve, 1_000));
        if (this.drained) break;
        continue;
      }
      refusals = 0;
      resume = true;
      let failed = stream === undefined;
      if (stream) {
        try {
          for await (const t of stream.trajectories()) {
            // Acked here, not by the client's autoAck, so the bench knows where on the stream each ack went.
            const finished = this.load.onTrajectory(t, { stream: this.stream!, seq: this.seq++ });
            stream.ack([{ taskId: t.taskId, sampleIndex: t.sampleIndex }]);
            if (finished === 0) continue;
            this.inflight -= finished;
            this.fill();
            this.maybeClose();
          }
        } catch {
          failed = true;
        }
      }
      if (this.drained || (!failed && !this.load.open && this.inflight === 0)) break;
      // The stream broke (server killed) or ended early: what had no answer is re-sent on the next stream.
      this.resend.push(...this.unanswered);
      this.unanswered.clear();
      this.session = undefined;
      this.stream = undefined;
      await this.load.waitForReconnect(generation, () => this.drained);
      if (this.drained) break;
    }
    clearTimeout(this.drainTimer);
    // After the drain, whatever is still unanswered or accepted was never delivered.
    for (const [, record] of this.load.tasksOf(this.index, ['sent', 'accepted'])) record.state = 'missing';
  }

  /** Opens (or resumes) the session; undefined when the server is not reachable. */
  private async attach(client: RolloutClient, resume: boolean): Promise<RolloutSession | undefined> {
    // Refusals come back at once: the soak counts them and refills (see send).
    let session = client.openSession({ sessionId: this.id, resume, highWater: 4096, autoAck: false, retryRejectedForMs: 0 });
    try {
      const opened = await session.opened;
      if (resume) this.load.reconnects.push({ session: this.index, resumed: true, redelivered: opened.redelivered, pending: opened.pending });
    } catch (err) {
      if (!resume || (err as ServiceError).code !== grpcStatus.NOT_FOUND) return undefined;
      // The restarted server does not know the session: what it had accepted for us is gone unless it says so.
      this.load.reconnects.push({ session: this.index, resumed: false, redelivered: 0, pending: 0, refused: (err as Error).message });
      await this.settleAcceptedAfterRestart(client);
      session = client.openSession({ sessionId: this.id, highWater: 4096, autoAck: false, retryRejectedForMs: 0 });
      try {
        await session.opened;
      } catch {
        return undefined;
      }
    }
    this.session = session;
    this.stream = this.load.newStream();
    this.seq = 0;
    this.readUpTo = 0;
    const again = this.resend;
    this.resend = [];
    for (const taskId of again) this.send(session, taskId, this.load.taskAgain(taskId), true);
    this.fill();
    this.maybeClose();
    return session;
  }

  /**
   * Asks the restarted server about every task it had accepted from us and not delivered: NOT_FOUND is a truthful
   * "lost"; a task it knows is sent again (same id and spec), so its trajectories come back as a duplicate's.
   */
  private async settleAcceptedAfterRestart(client: RolloutClient): Promise<void> {
    for (const [taskId, record] of [...this.load.tasksOf(this.index, ['accepted'])]) {
      try {
        await client.getTrajectory(taskId, { deadlineMs: 10_000 });
        this.resend.push(taskId);
      } catch (err) {
        if ((err as ServiceError).code !== grpcStatus.NOT_FOUND) throw err;
        record.state = 'lost';
        this.inflight -= record.n;
      }
    }
  }

  private fill(): void {
    const session = this.session;
    if (!session) return;
    while (this.load.open && this.inflight + this.load.o.groupSize <= this.target) {
      const { taskId, input, n } = this.load.newTask(this.index);
      this.inflight += n;
      this.send(session, taskId, input, false);
    }
  }

  private send(session: RolloutSession, taskId: string, input: TaskInput, again: boolean): void {
    this.unanswered.add(taskId);
    const at = { stream: this.stream!, seq: this.seq++ };
    const answered = (): void => {
      if (at.stream === this.stream) this.readUpTo = Math.max(this.readUpTo, at.seq);
    };
    session.submit(input).then(
      (accepted) => {
        if (this.session !== session) return;
        answered();
        this.unanswered.delete(taskId);
        if (again && accepted.duplicate) this.load.counts.resubmitDuplicates++;
        const record = this.load.record(taskId);
        if (record?.state === 'sent') record.state = 'accepted';
        if (record && record.acceptedAt === undefined) {
          record.acceptedAt = performance.now();
          if (!again) this.load.acceptMs.push(record.acceptedAt - record.submittedAt);
        }
        this.maybeClose();
      },
      (err: unknown) => {
        // A broken stream rejects every pending submit: those are re-sent on the next stream (see run).
        if (this.session !== session || !(err instanceof TaskRejectedError)) return;
        answered();
        this.unanswered.delete(taskId);
        const record = this.load.record(taskId);
        if (record && record.state !== 'finished') {
          record.state = 'rejected';
          this.inflight -= record.n;
        }
        const reasons = this.load.counts.rejectReasons;
        const key = `${err.field}: ${err.reason.slice(0, 120)}`;
        reasons[key] = (reasons[key] ?? 0) + 1;
        this.fill();
        this.maybeClose();
      },
    );
  }

  private maybeClose(): void {
    if (!this.load.open && this.inflight === 0 && this.unanswered.size === 0) this.session?.close();
  }
}

function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}
