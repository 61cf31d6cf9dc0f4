import { RolloutError } from '../errors.js';
import type { Ack, DeliveryPaused, RolloutResponse, Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { StoredTrajectory } from '../pipeline/wire-safe.js';
import { framedBytes } from './response-encode.js';
import type { StreamWriter } from './stream-writer.js';

/**
 * The most task ids and trajectory refs one Ack may list together. An ack is applied in one go on the event loop, and
 * each ref is one journal write of the same transaction: bounded so one message (maxMessageBytes holds millions of
 * refs) cannot stall the server or overfill a commit. Far above what a training step acks at once; a larger ack is
 * refused by field (nothing of it applied) and the client sends it in parts.
 */
export const MAX_ACK_ENTRIES = 65_536;

/**
 * Refuses an Ack over `limit` entries (config sessions.maxAckEntries, at most {@link MAX_ACK_ENTRIES}): INVALID_ARGUMENT
 * naming its larger list, before any of it is applied.
 */
export function checkAckSize(ack: Ack, limit = MAX_ACK_ENTRIES): void {
  const entries = ack.taskIds.length + ack.trajectories.length;
  if (entries <= limit) return;
  const field = ack.trajectories.length >= ack.taskIds.length ? 'ack.trajectories' : 'ack.task_ids';
  throw RolloutError.invalid(field, `an ack may list at most ${limit} task ids and trajectories together, got ${entries}: send it as several acks (nothing of this one was applied)`);
}

/** What a session knows of one of its tasks; forgotten once every sample was delivered and acked. */
interface SessionTask {
  /** Samples expected (0 until the task is accepted). */
  n: number;
  accepted: boolean;
  /** Samples finished and taken by the session (sent, or held while delivery is paused). */
  delivered: Set<number>;
  /** Sent and not acked: their wire bytes only (see Session on memory), with their size as counted. */
  unacked: Map<number, { stored: StoredTrajectory; bytes: number }>;
  /** Samples held (finished, not sent yet). */
  held: number;
}

/** The stream a session is attached to, and how to end it when another stream takes the session over. */
export interface Attachment {
  writer: StreamWriter<RolloutResponse>;
  /** Ends the stream with a status saying it was taken over (the session has already moved on). */
  evict: (reason: string) => void;
}

/**
 * A trainer's session: the tasks it submitted and the trajectories it has not acked.
 *
 * Delivery is at least once until acked: each trajectory is written once per attachment; a client that
 * reconnects with `resume` (or takes the session over from a stale stream) gets every unacked trajectory again,
 * once, then the rest as they finish. A client dedupes by (task_id, sample_index) across streams.
 *
 * Memory is bounded in bytes: trajectories sent and not acked are counted by their encoded size; one that would take
 * them past `maxUnackedBytes` is held instead, in completion order. The client is told (`delivery_paused`) when the
 * unacked bytes reach the bound or a trajectory is held - the state in which new tasks are refused - and (`resumed`)
 * when acks have sent every held one and brought the bytes back under the bound. Held trajectories are never dropped.
 * What the bound counts is what the session holds: unacked and held trajectories are kept as their wire bytes
 * (StoredTrajectory, the same bytes the task store keeps: no copy), not as objects — a trajectory object's token arrays
 * take ~2x its encoded size on the V8 heap, and a trainer that acks once per training step can leave a whole step's
 * trajectories unacked. A re-send (resume, release after a pause) writes those bytes without decoding them. While
 * delivery is paused the session admits no new task (rollout-service refuses them with RESOURCE_EXHAUSTED, to be
 * re-submitted after acking: task ids are idempotent), so what it holds is bounded by maxUnackedBytes plus the work it
 * had in flight when the bound was reached. A task is forgotten once all its samples were delivered and acked, so a
 * long-lived session that acks stays small. In memory; with a journal, a restart rebuilds it from what the journal
 * recorded: the tasks it was answered `accepted` for (duplicates included: Journal.owed) and its acks.
 */
export class Session {
  private readonly tasks = new Map<string, SessionTask>();
  private readonly claimed = new Set<string>();
  private expected = 0;
  private delivered = 0;
  private attachment: Attachment | undefined;
  private readonly idleWaiters = new Set<() => void>();
  /** Finished, not yet sent: delivery is paused while this is not empty. */
  private readonly held: StoredTrajectory[] = [];
  private heldBytesTotal = 0;
  private unackedBytesTotal = 0;
  /** What the attached client was last told of {@link deliveryPaused} (see {@link sayPause}). */
  private pausedSaid = false;
  /** The attached stream's client half-closed: no ack can come on it (see {@link endOfAcks}). */
  private acksEnded = false;
  private unackedTotal = 0;
  detachedAt: number | undefined;
  /**
   * Called when this session attaches, detaches, or gains bytes while detached: the manager keeps a running total of
   * what detached sessions hold, to bound it.
   */
  onDetachedBytes: (() => void) | undefined;

  constructor(
    readonly id: string,
    public stageEvents: boolean,
    readonly maxUnackedBytes: number = Number.POSITIVE_INFINITY,
  ) {}

  /** Bound to a task's sinks; dedupes so a re-submitted task is still delivered once. */
  readonly sink = (trajectory: Trajectory): void => {
    const task = this.task(trajectory.taskId);
    if (task.delivered.has(trajectory.sampleIndex)) return;
    task.delivered.add(trajectory.sampleIndex);
    this.delivered++;
    const stored = StoredTrajectory.of(trajectory);
    if (this.held.length > 0 || !this.fits(storedBytes(stored))) this.hold(task, stored);
    // Sent as a view of the stored bytes, never as the pipeline's object: a stream whose client is slow holds what it
    // queued until sessions.stalledMs, and the object's token arrays would be ~2x the bytes again beside them.
    else this.deliver(task, stored);
    this.sayPause();
    this.wakeIdle();
    if (!this.attachment) this.onDetachedBytes?.();
  };

  /** Marks a task as being submitted on this session, so its first stage events (queued, init) reach it. */
  claim(taskId: string): void {
    this.claimed.add(taskId);
  }

  /** Records a task accepted on this session (idempotent per task id while the session remembers it). */
  expect(taskId: string, numSamples: number): void {
    this.claimed.delete(taskId);
    const task = this.task(taskId);
    if (task.accepted) return;
    task.accepted = true;
    task.n = numSamples;
    this.expected += numSamples;
  }

  /** True when this session has accepted the task already (its samples are counted in `pending` or delivered). */
  hasAccepted(taskId: string): boolean {
    return this.tasks.get(taskId)?.accepted === true;
  }

  /** The samples of an accepted task this session has acked (taken: neither unacked nor held), in order. */
  ackedSamples(taskId: string): number[] {
    const task = this.tasks.get(taskId);
    if (!task?.accepted) return [];
    // The held queue is scanned only for a task with held samples (a re-submit while delivery is paused).
    const held = task.held > 0 ? new Set(this.held.filter((s) => s.taskId === taskId).map((s) => s.sampleIndex)) : undefined;
    return [...task.delivered].filter((i) => !task.unacked.has(i) && !held?.has(i)).sort((a, b) => a - b);
  }

  /**
   * The accepted task was submitted again: of `samples` (its {@link ackedSamples} before), those still acked are owed
   * again — sent as the task's finished trajectories are replayed to {@link sink} (Runtime's duplicate), or as a
   * re-run finishes them. Submitting means "send me this task's samples": a trainer that died having acked part of a
   * group, and submits the task on resume, gets the whole group. Returns the samples owed again.
   */
  oweAgain(taskId: string, samples: readonly number[]): number[] {
    const task = this.tasks.get(taskId);
    if (!task?.accepted) return [];
    const still = new Set(this.ackedSamples(taskId));
    const again = samples.filter((i) => still.has(i));
    for (const i of again) task.delivered.delete(i);
    this.delivered -= again.length;
    return again;
  }

  /** The submit was rejected: drop the claim. */
  unclaim(taskId: string): void {
    this.claimed.delete(taskId);
  }

  owns(taskId: string): boolean {
    return this.tasks.get(taskId)?.accepted === true || this.claimed.has(taskId);
  }

  get isAttached(): boolean {
    return this.attachment !== undefined;
  }

  /**
   * Attaches a stream. A stream still attached is evicted first (takeover: its client is gone or stale, and the new
   * stream wins). On resume, re-sends what was not acked, then tells the client if delivery is paused.
   */
  attach(attachment: Attachment, resume: boolean): { redelivered: number; tookOver: boolean } {
    const previous = this.attachment;
    const tookOver = previous !== undefined && previous.writer !== attachment.writer;
    this.attachment = attachment;
    this.detachedAt = undefined;
    this.pausedSaid = false; // a new stream was told nothing yet
    this.acksEnded = false;
    this.onDetachedBytes?.();
    if (tookOver) previous.evict(`session "${this.id}" was resumed on another stream`);
    if (!resume) {
      this.sayPause();
      return { redelivered: 0, tookOver };
    }
    let redelivered = 0;
    for (const task of this.tasks.values()) {
      for (const { stored } of task.unacked.values()) {
        attachment.writer.send({ kind: { $case: 'trajectory', value: stored.trajectory() } });
        redelivered++;
      }
    }
    this.sayPause();
    return { redelivered, tookOver };
  }

  /** Detaches this writer if it is the one attached (a stream taken over detaches nothing). */
  detach(writer: StreamWriter<RolloutResponse>): void {
    if (this.attachment?.writer !== writer) return;
    this.attachment = undefined;
    this.acksEnded = false; // what finishes now is held for a resume, under the bound again
    this.detachedAt = Date.now();
    this.wakeIdle();
    this.onDetachedBytes?.();
  }

  send(message: RolloutResponse): void {
    this.attachment?.writer.send(message);
  }

  /**
   * Acks trajectories. An acked one is never sent (again): it leaves the unacked set and, acked by reference, the
   * held queue if it waits there. An ack of a sample of an accepted task that was not delivered yet (recovery replays
   * the journal's acks before the trajectories come back) marks it delivered, so it is not sent when it arrives: the
   * client says it has it. A whole-task ack acks what was sent so far.
   *
   * Returns the same ack as the journal must record it: a whole-task ack of a task this session still remembers
   * becomes the samples it had sent (held ones were not: they are sent later, and a restart must send them too); one
   * of a task it does not remember (everything delivered and acked, or never this session's) stays whole.
   */
  ack(ack: Ack): Ack {
    const durable: Ack = { taskIds: [], trajectories: [...ack.trajectories] };
    for (const taskId of ack.taskIds) {
      const task = this.tasks.get(taskId);
      if (!task) {
        durable.taskIds.push(taskId);
        continue;
      }
      // A whole-task ack acks what was sent: held samples were not, and are sent later.
      for (const index of [...task.unacked.keys()]) {
        durable.trajectories.push({ taskId, sampleIndex: index });
        this.unack(task, index);
      }
      this.forgetIfDone(taskId);
    }
    // Acked held samples are dropped in one pass after the loop: one scan of the held queue per ref would make an ack
    // of many refs quadratic in what is held (seconds of event loop).
    const dropping = new Set<string>();
    for (const ref of ack.trajectories) {
      const task = this.tasks.get(ref.taskId);
      if (!task) continue;
      this.unack(task, ref.sampleIndex);
      if (task.held > 0) dropping.add(heldKey(ref.taskId, ref.sampleIndex));
      if (task.accepted && Number.isInteger(ref.sampleIndex) && ref.sampleIndex >= 0 && ref.sampleIndex < task.n && !task.delivered.has(ref.sampleIndex)) {
        task.delivered.add(ref.sampleIndex);
        this.delivered++;
      }
      this.forgetIfDone(ref.taskId);
    }
    if (dropping.size > 0) this.dropHeld(dropping);
    this.release();
    this.sayPause();
    this.wakeIdle();
    return durable;
  }

  /** Removes acked samples (by {@link heldKey}) from the held queue, in one pass: they must never be sent. */
  private dropHeld(acked: ReadonlySet<string>): void {
    const touched = new Set<string>();
    let kept = 0;
    for (const stored of this.held) {
      if (!acked.has(heldKey(stored.taskId, stored.sampleIndex))) {
        this.held[kept++] = stored;
        continue;
      }
      this.heldBytesTotal -= storedBytes(stored);
      const task = this.tasks.get(stored.taskId);
      if (task) task.held--;
      touched.add(stored.taskId);
    }
    if (touched.size === 0) return;
    this.held.length = kept;
    for (const taskId of touched) this.forgetIfDone(taskId);
    if (this.held.length === 0) this.heldBytesTotal = 0;
  }

  /** Tasks the session still remembers (not yet fully delivered and acked). */
  get rememberedTasks(): number {
    return this.tasks.size;
  }

  /** Trajectories sent and not acked. */
  get unackedCount(): number {
    return this.unackedTotal;
  }

  /** Encoded bytes of the trajectories sent and not acked. */
  get unackedBytes(): number {
    return this.unackedBytesTotal;
  }

  /**
   * Whether delivery is paused: trajectories are held, or the unacked ones fill the bound. New tasks on the session
   * are refused meanwhile (see rollout-service), so what it holds is bounded by the work admitted before.
   */
  get deliveryPaused(): boolean {
    return this.held.length > 0 || (!this.acksEnded && this.unackedBytesTotal >= this.maxUnackedBytes);
  }

  /**
   * The attached stream's client half-closed: it sends nothing more, acks included, so what the session holds back for
   * acks could never be released and the stream, which ends once everything is sent, would never end. From now on
   * (until the stream detaches) the bound no longer holds delivery: held trajectories go at once, and those still
   * finishing as they finish. Nothing grows: held ones are in memory either way, and no task can come on that stream.
   * They stay unacked (kept for a resume: at least once). Only for the stream attached now: a stream already detached
   * (its cancel seen first) changes nothing, what it holds back stays held for a resume. A cancel that Node's HTTP/2
   * client sends as END_STREAM then RST_STREAM arrives here first, as a half-close: its held ones are sent into the
   * dying stream and come again on the resume as redelivered (see rollout-service).
   */
  endOfAcks(writer: StreamWriter<RolloutResponse>): void {
    if (this.attachment?.writer !== writer) return;
    this.acksEnded = true;
    this.release();
    this.sayPause();
    this.wakeIdle();
  }

  /** Bytes queued on the attached stream, not yet taken by the transport. */
  get outboxBytes(): number {
    return this.attachment?.writer.queuedBytes ?? 0;
  }

  /** Finished trajectories not sent yet because delivery is paused. */
  get heldCount(): number {
    return this.held.length;
  }

  get heldBytes(): number {
    return this.heldBytesTotal;
  }

  /** Samples accepted on this session that have not finished yet. */
  get pending(): number {
    return this.expected - this.delivered;
  }

  /** Resolves when every accepted sample has been sent (none pending or held), or the stream detached. */
  async idle(): Promise<void> {
    while ((this.pending > 0 || this.held.length > 0) && this.attachment) {
      await new Promise<void>((resolve) => {
        const wake = (): void => {
          this.idleWaiters.delete(wake);
          resolve();
        };
        this.idleWaiters.add(wake);
      });
    }
  }

  /** Room for this many bytes under the bound; one trajectory alone always fits, so a huge one cannot wedge delivery. */
  private fits(bytes: number): boolean {
    return this.acksEnded || this.unackedTotal === 0 || this.unackedBytesTotal + bytes <= this.maxUnackedBytes;
  }

  /** Sends a trajectory (a view of its stored bytes: nothing decodes it) and keeps its bytes until acked. */
  private deliver(task: SessionTask, stored: StoredTrajectory): void {
    const bytes = storedBytes(stored);
    task.unacked.set(stored.sampleIndex, { stored, bytes });
    this.unackedBytesTotal += bytes;
    this.unackedTotal++;
    this.attachment?.writer.send({ kind: { $case: 'trajectory', value: stored.trajectory() } });
  }

  private hold(task: SessionTask, stored: StoredTrajectory): void {
    task.held++;
    this.held.push(stored);
    this.heldBytesTotal += storedBytes(stored);
  }

  /** Sends held trajectories while they fit. */
  private release(): void {
    if (this.held.length === 0) return;
    while (this.held.length > 0 && this.fits(storedBytes(this.held[0]!))) {
      const stored = this.held.shift()!;
      this.heldBytesTotal -= storedBytes(stored);
      const task = this.task(stored.taskId);
      task.held--;
      this.deliver(task, stored);
    }
    if (this.held.length === 0) {
      this.heldBytesTotal = 0;
      this.wakeIdle();
    }
  }

  /**
   * Tells the attached client when {@link deliveryPaused} changes, once per change: the pause it is told of is the very
   * state in which the session refuses new tasks (unacked bytes at the bound, or trajectories held), so a client whose
   * submit is refused has always been told why - before, only a held trajectory was said, and a client at the bound
   * with nothing held yet was refused submits it had no notice for (a Python caller waiting in submit() never acked).
   */
  private sayPause(): void {
    const paused = this.deliveryPaused;
    if (paused === this.pausedSaid) return;
    this.pausedSaid = paused;
    this.attachment?.writer.sendUrgent(this.notice(!paused));
  }

  private notice(resumed: boolean): RolloutResponse {
    const value: DeliveryPaused = {
      unackedBytes: this.unackedBytesTotal,
      limitBytes: Number.isFinite(this.maxUnackedBytes) ? this.maxUnackedBytes : 0,
      held: this.held.length,
      reason: resumed
        ? 'acks brought unacked trajectories under the limit: delivery resumed'
        : `unacked trajectories reached ${this.maxUnackedBytes} bytes: delivery paused until you ack what you received (nothing is dropped)`,
      resumed,
    };
    return { kind: { $case: 'deliveryPaused', value } };
  }

  private unack(task: SessionTask, index: number): void {
    const entry = task.unacked.get(index);
    if (!entry) return;
    task.unacked.delete(index);
    this.unackedBytesTotal -= entry.bytes;
    this.unackedTotal--;
  }

  private task(taskId: string): SessionTask {
    let task = this.tasks.get(taskId);
    if (!task) this.tasks.set(taskId, (task = { n: 0, accepted: false, delivered: new Set(), unacked: new Map(), held: 0 }));
    return task;
  }

  private forgetIfDone(taskId: string): void {
    const task = this.tasks.get(taskId);
    if (task?.accepted && task.delivered.size >= task.n && task.unacked.size === 0 && task.held === 0) this.tasks.delete(taskId);
  }

  private wakeIdle(): void {
    for (const wake of [...this.idleWaiters]) wake();
  }
}

/** A sample's key in a set of refs. */
function heldKey(taskId: string, sampleIndex: number): string {
  return `${sampleIndex}\u0000${taskId}`;
}

/** What a trajectory counts against the bound: its bytes as a response carries them, as trajectoryBytes counts. */
function storedBytes(stored: StoredTrajectory): number {
  return framedBytes(stored.bytes);
}
