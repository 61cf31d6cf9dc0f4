import type { Ack, RolloutResponse, Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { StreamWriter } from './stream-writer.js';

/** What a session knows of one of its tasks; forgotten once every sample was delivered and acked. */
interface SessionTask {
  /** Samples expected (0 until the task is accepted). */
  n: number;
  accepted: boolean;
  delivered: Set<number>;
  unacked: Map<number, Trajectory>;
}

/**
 * A trainer's session: the tasks it submitted and the trajectories it has not acked. Each trajectory is written
 * once per attachment; a client that reconnects with `resume` gets every unacked trajectory again, once.
 * A task is forgotten once all its samples were delivered and acked, so a long-lived session that acks stays
 * small. In memory only for now: a server restart loses sessions (the durable journal is a later issue).
 */
export class Session {
  private readonly tasks = new Map<string, SessionTask>();
  private readonly claimed = new Set<string>();
  private expected = 0;
  private delivered = 0;
  private writer: StreamWriter<RolloutResponse> | undefined;
  private readonly idleWaiters = new Set<() => void>();
  detachedAt: number | undefined;

  constructor(
    readonly id: string,
    public stageEvents: boolean,
  ) {}

  /** Bound to a task's sinks; dedupes so a re-submitted task is still delivered once. */
  readonly sink = (trajectory: Trajectory): void => {
    const task = this.task(trajectory.taskId);
    if (task.delivered.has(trajectory.sampleIndex)) return;
    task.delivered.add(trajectory.sampleIndex);
    task.unacked.set(trajectory.sampleIndex, trajectory);
    this.delivered++;
    this.writer?.send({ kind: { $case: 'trajectory', value: trajectory } });
    this.wakeIdle();
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

  /** The submit was rejected: drop the claim. */
  unclaim(taskId: string): void {
    this.claimed.delete(taskId);
  }

  owns(taskId: string): boolean {
    return this.tasks.get(taskId)?.accepted === true || this.claimed.has(taskId);
  }

  /** Attaches a stream; on resume re-sends what was not acked. Returns how many were re-sent. */
  attach(writer: StreamWriter<RolloutResponse>, resume: boolean): number {
    this.writer = writer;
    this.detachedAt = undefined;
    if (!resume) return 0;
    let resent = 0;
    for (const task of this.tasks.values()) {
      for (const trajectory of task.unacked.values()) {
        writer.send({ kind: { $case: 'trajectory', value: trajectory } });
        resent++;
      }
    }
    return resent;
  }

  detach(writer: StreamWriter<RolloutResponse>): void {
    if (this.writer !== writer) return;
    this.writer = undefined;
    this.detachedAt = Date.now();
    this.wakeIdle();
  }

  send(message: RolloutResponse): void {
    this.writer?.send(message);
  }

  ack(ack: Ack): void {
    for (const taskId of ack.taskIds) {
      const task = this.tasks.get(taskId);
      task?.unacked.clear();
      this.forgetIfDone(taskId);
    }
    for (const ref of ack.trajectories) {
      this.tasks.get(ref.taskId)?.unacked.delete(ref.sampleIndex);
      this.forgetIfDone(ref.taskId);
    }
  }

  /** Tasks the session still remembers (not yet fully delivered and acked). */
  get rememberedTasks(): number {
    return this.tasks.size;
  }

  get unackedCount(): number {
    let n = 0;
    for (const task of this.tasks.values()) n += task.unacked.size;
    return n;
  }

  /** Samples accepted on this session that have not finished yet. */
  get pending(): number {
    return this.expected - this.delivered;
  }

  /** Resolves when every accepted sample has been delivered (or the writer detached). */
  async idle(): Promise<void> {
    while (this.pending > 0 && this.writer) {
      await new Promise<void>((resolve) => {
        const wake = (): void => {
          this.idleWaiters.delete(wake);
          resolve();
        };
        this.idleWaiters.add(wake);
      });
    }
  }

  private task(taskId: string): SessionTask {
    let task = this.tasks.get(taskId);
    if (!task) this.tasks.set(taskId, (task = { n: 0, accepted: false, delivered: new Set(), unacked: new Map() }));
    return task;
  }

  private forgetIfDone(taskId: string): void {
    const task = this.tasks.get(taskId);
    if (task?.accepted && task.delivered.size >= task.n && task.unacked.size === 0) this.tasks.delete(taskId);
  }

  private wakeIdle(): void {
    for (const wake of [...this.idleWaiters]) wake();
  }
}
