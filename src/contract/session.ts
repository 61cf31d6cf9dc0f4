import type { Ack, RolloutResponse, Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { StreamWriter } from './stream-writer.js';

const key = (taskId: string, sampleIndex: number): string => `${taskId}\u0000${sampleIndex}`;

/**
 * A trainer's session: the tasks it submitted and the trajectories it has not acked. Each trajectory is written
 * once per attachment; a client that reconnects with `resume` gets every unacked trajectory again, once.
 * In memory only for now: a server restart loses sessions (the durable journal is a later issue).
 */
export class Session {
  private readonly unacked = new Map<string, Trajectory>();
  private readonly delivered = new Set<string>();
  private readonly taskIds = new Set<string>();
  private readonly claimed = new Set<string>();
  private expected = 0;
  private writer: StreamWriter<RolloutResponse> | undefined;
  private readonly idleWaiters = new Set<() => void>();
  detachedAt: number | undefined;

  constructor(
    readonly id: string,
    public stageEvents: boolean,
  ) {}

  /** Bound to a task's sinks; dedupes so a re-submitted task is still delivered once. */
  readonly sink = (trajectory: Trajectory): void => {
    const k = key(trajectory.taskId, trajectory.sampleIndex);
    if (this.delivered.has(k)) return;
    this.delivered.add(k);
    this.unacked.set(k, trajectory);
    this.writer?.send({ kind: { $case: 'trajectory', value: trajectory } });
    this.wakeIdle();
  };

  /** Marks a task as being submitted on this session, so its first stage events (queued, init) reach it. */
  claim(taskId: string): void {
    this.claimed.add(taskId);
  }

  /** Records a task accepted on this session (idempotent per task id). */
  expect(taskId: string, numSamples: number): void {
    this.claimed.delete(taskId);
    if (this.taskIds.has(taskId)) return;
    this.taskIds.add(taskId);
    this.expected += numSamples;
  }

  /** The submit was rejected: drop the claim. */
  unclaim(taskId: string): void {
    this.claimed.delete(taskId);
  }

  owns(taskId: string): boolean {
    return this.taskIds.has(taskId) || this.claimed.has(taskId);
  }

  /** Attaches a stream; on resume re-sends what was not acked. Returns how many were re-sent. */
  attach(writer: StreamWriter<RolloutResponse>, resume: boolean): number {
    this.writer = writer;
    this.detachedAt = undefined;
    if (!resume) return 0;
    for (const trajectory of this.unacked.values()) writer.send({ kind: { $case: 'trajectory', value: trajectory } });
    return this.unacked.size;
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
      for (const k of this.unacked.keys()) if (k.startsWith(`${taskId}\u0000`)) this.unacked.delete(k);
    }
    for (const ref of ack.trajectories) this.unacked.delete(key(ref.taskId, ref.sampleIndex));
  }

  get unackedCount(): number {
    return this.unacked.size;
  }

  /** Samples accepted on this session that have not finished yet. */
  get pending(): number {
    return this.expected - this.delivered.size;
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

  private wakeIdle(): void {
    for (const wake of [...this.idleWaiters]) wake();
  }
}
