import { RolloutError } from '../errors.js';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { encodedTrajectory } from './wire-safe.js';
import type { Sample } from './sample.js';
import type { ResolvedTask, TrajectorySink } from './task.js';

/** A submitted task: its samples while they run, its trajectories once they finish. */
export interface TaskEntry {
  task: ResolvedTask;
  samples: Sample[];
  trajectories: (Trajectory | undefined)[];
  pending: number;
  waiters: Set<() => void>;
  /** Where each finished trajectory goes: the sessions that submitted (or re-submitted) the task. */
  sinks: Set<TrajectorySink>;
}

/**
 * Tasks by task_id: the idempotency record behind Submit and the store behind GetTrajectory. Finished tasks are
 * kept up to `retain` tasks and about `retainBytes` of trajectories (oldest dropped first), so a long training
 * run with long trajectories does not grow the server without bound.
 */
export class TaskStore {
  private readonly tasks = new Map<string, TaskEntry>();
  /** Finished task ids, oldest first, with their estimated size. */
  private readonly finished = new Map<string, number>();
  private finishedBytes = 0;

  constructor(
    private readonly retain: number,
    private readonly retainBytes: number = Number.POSITIVE_INFINITY,
  ) {}

  get(taskId: string): TaskEntry | undefined {
    return this.tasks.get(taskId);
  }

  /** Returns the existing entry for a retry with the same spec; throws when the id is reused with another spec. */
  existing(task: ResolvedTask): TaskEntry | undefined {
    const entry = this.tasks.get(task.taskId);
    if (entry && entry.task.fingerprint !== task.fingerprint) {
      throw RolloutError.invalid('task_id', `"${task.taskId}" was already submitted with a different spec`);
    }
    return entry;
  }

  add(task: ResolvedTask): TaskEntry {
    const entry: TaskEntry = { task, samples: [], trajectories: new Array<Trajectory | undefined>(task.numSamples).fill(undefined), pending: task.numSamples, waiters: new Set(), sinks: new Set() };
    this.tasks.set(task.taskId, entry);
    return entry;
  }

  /** Forgets a task that was never started (its acceptance could not be made durable). */
  remove(taskId: string): void {
    if (!this.finished.has(taskId)) this.tasks.delete(taskId);
  }

  /** Records a finished sample; wakes GetTrajectory waiters; evicts old finished tasks. */
  record(trajectory: Trajectory): void {
    const entry = this.tasks.get(trajectory.taskId);
    if (!entry || entry.trajectories[trajectory.sampleIndex] !== undefined) return;
    entry.trajectories[trajectory.sampleIndex] = trajectory;
    entry.pending--;
    for (const wake of entry.waiters) wake();
    for (const sink of entry.sinks) sink(trajectory);
    if (entry.pending === 0) {
      entry.samples = [];
      entry.sinks.clear();
      const bytes = estimateBytes(entry);
      this.finished.set(trajectory.taskId, bytes);
      this.finishedBytes += bytes;
      while (this.finished.size > 0 && (this.finished.size > this.retain || this.finishedBytes > this.retainBytes)) {
        const [oldest, size] = this.finished.entries().next().value!;
        this.finished.delete(oldest);
        this.finishedBytes -= size;
        this.tasks.delete(oldest);
      }
    }
  }

  /** Drops every finished task (running ones stay); returns what was dropped. For benchmarks and admin tools. */
  dropFinished(): { tasks: number; trajectories: number } {
    let trajectories = 0;
    for (const taskId of this.finished.keys()) {
      trajectories += this.tasks.get(taskId)?.trajectories.length ?? 0;
      this.tasks.delete(taskId);
    }
    const tasks = this.finished.size;
    this.finished.clear();
    this.finishedBytes = 0;
    return { tasks, trajectories };
  }

  /** Estimated bytes held by finished tasks. */
  get retainedBytes(): number {
    return this.finishedBytes;
  }

  /** Resolves when the given samples have finished or the signal fires. */
  async waitFor(entry: TaskEntry, indices: readonly number[], signal: AbortSignal): Promise<void> {
    const done = (): boolean => indices.every((i) => entry.trajectories[i] !== undefined);
    while (!done() && !signal.aborted) {
      await new Promise<void>((resolve) => {
        const wake = (): void => {
          entry.waiters.delete(wake);
          signal.removeEventListener('abort', wake);
          resolve();
        };
        entry.waiters.add(wake);
        signal.addEventListener('abort', wake, { once: true });
      });
    }
  }

  get size(): number {
    return this.tasks.size;
  }
}

/** A rough size of a finished task in memory: token arrays (8 bytes an element), encoded bytes, message text, the spec. */
function estimateBytes(entry: TaskEntry): number {
  let bytes = 512 + 2 * entry.task.fingerprint.length;
  for (const t of entry.trajectories) {
    if (!t) continue;
    // Token arrays as JS numbers, plus the encoded bytes kept beside each trajectory for the streams (wireSafe).
    bytes += 256 + 8 * (t.promptTokenIds.length + 3 * t.responseTokenIds.length) + 48 * t.turns.length + (encodedTrajectory(t)?.length ?? 0);
    for (const m of t.messages) bytes += 2 * m.content.length + 64;
  }
  return bytes;
}
