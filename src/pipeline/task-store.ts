import { RolloutError } from '../errors.js';
import { TaskSpec, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { canonicalJson } from './canonical-json.js';
import { StoredTrajectory } from './wire-safe.js';
import type { Sample } from './sample.js';
import type { ResolvedTask, TrajectorySink } from './task.js';

/**
 * What the store keeps of a task: a validated one (ResolvedTask), or one recovered from the journal that no longer
 * validates, whose fingerprint is then its spec's as sent ({@link specFingerprint}).
 */
export type StoredTask = Pick<ResolvedTask, 'taskId' | 'numSamples' | 'fingerprint'>;

/** A submitted task: its samples while they run, its trajectories once they finish. */
export interface TaskEntry {
  task: StoredTask;
  /** Recovered from the journal no longer valid ({@link TaskStore.addUnrunnable}): it has no samples, never runs. */
  unrunnable?: true;
  samples: Sample[];
  /**
   * A cancel arrived before the samples existed (the task admitted, its journal write under way): they are
   * cancelled as soon as they are made.
   */
  cancelRequested?: true;
  /** Finished samples, as their wire bytes (see StoredTrajectory). */
  trajectories: (StoredTrajectory | undefined)[];
  pending: number;
  waiters: Set<() => void>;
  /** Where each finished trajectory goes: the sessions that submitted (or re-submitted) the task. */
  sinks: Set<TrajectorySink>;
  /** Estimated bytes this entry holds: its spec, then each trajectory as it finishes (see estimate below). */
  bytes: number;
}

/**
 * Tasks by task_id: the idempotency record behind Submit and the store behind GetTrajectory. Finished tasks are
 * kept up to `retain` tasks and about `retainBytes` of them (oldest dropped first), so a long training run with
 * long trajectories does not grow the server without bound.
 *
 * Bytes count everything an entry holds, as it comes: the spec (its canonical JSON and the validated instance
 * object) from `add`, and each trajectory from `record` — kept as its wire bytes only (StoredTrajectory: token
 * arrays, transcript, eval report and all, off the V8 heap) — even while other samples of its task still run (a
 * 256-sample group of long trajectories is large before it is done).
 * Running tasks are never dropped (they are bounded by admission, `maxAdmitted`); `bytes` reports them too.
 */
export class TaskStore {
  private readonly tasks = new Map<string, TaskEntry>();
  /** Finished task ids, oldest first, with their estimated size. */
  private readonly finished = new Map<string, number>();
  private finishedBytes = 0;
  private totalBytes = 0;

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

  add(task: StoredTask): TaskEntry {
    const entry: TaskEntry = {
      task,
      samples: [],
      trajectories: new Array<StoredTrajectory | undefined>(task.numSamples).fill(undefined),
      pending: task.numSamples,
      waiters: new Set(),
      sinks: new Set(),
      bytes: specBytes(task),
    };
    this.totalBytes += entry.bytes;
    this.tasks.set(task.taskId, entry);
    return entry;
  }

  /**
   * Adds a task recovered from the journal that no longer validates (its environment is gone, or its spec breaks a
   * bound lowered since): none of its samples will run; the caller records a trajectory for each (INVALID_TASK, or
   * the one journaled before the restart), so GetTrajectory finds it as any finished task, its sinks get them, and a
   * re-submit of the same spec is its duplicate ({@link unrunnable}) — not a new task, not a rejection.
   */
  addUnrunnable(spec: TaskSpec, numSamples: number): TaskEntry {
    const entry = this.add({ taskId: spec.taskId, numSamples, fingerprint: specFingerprint(spec) });
    entry.unrunnable = true;
    return entry;
  }

  /**
   * The entry a re-submit of `spec` duplicates when it is a task recovered unrunnable with the same spec: checked
   * before validation, which the spec would fail again. One lookup by id when there is none (the accept path).
   */
  unrunnable(spec: TaskSpec): TaskEntry | undefined {
    const entry = this.tasks.get(spec.taskId);
    return entry?.unrunnable && entry.task.fingerprint === specFingerprint(spec) ? entry : undefined;
  }

  /** Forgets a task that was never started (its acceptance could not be made durable). */
  remove(taskId: string): void {
    const entry = this.tasks.get(taskId);
    if (!entry || this.finished.has(taskId)) return;
    this.tasks.delete(taskId);
    // Its bytes go with it: `bytes` would otherwise grow by a spec for every acceptance a full journal refused.
    this.totalBytes -= entry.bytes;
  }

  /** Records a finished sample; wakes GetTrajectory waiters; evicts old finished tasks. */
  record(trajectory: Trajectory): void {
    const entry = this.tasks.get(trajectory.taskId);
    if (!entry || entry.trajectories[trajectory.sampleIndex] !== undefined) return;
    const stored = StoredTrajectory.of(trajectory);
    entry.trajectories[trajectory.sampleIndex] = stored;
    entry.pending--;
    const added = storedBytes(stored);
    entry.bytes += added;
    this.totalBytes += added;
    for (const wake of entry.waiters) wake();
    for (const sink of entry.sinks) sink(trajectory);
    if (entry.pending === 0) {
      entry.samples = [];
      entry.sinks.clear();
      this.finished.set(trajectory.taskId, entry.bytes);
      this.finishedBytes += entry.bytes;
      while (this.finished.size > 0 && (this.finished.size > this.retain || this.finishedBytes > this.retainBytes)) {
        const [oldest, size] = this.finished.entries().next().value!;
        this.finished.delete(oldest);
        this.finishedBytes -= size;
        this.totalBytes -= size;
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
    this.totalBytes -= this.finishedBytes;
    this.finishedBytes = 0;
    return { tasks, trajectories };
  }

  /**
   * Drops the oldest retained finished tasks — about an eighth of them, at least one — and returns how many. For the
   * journal: its size bound wins over retention for GetTrajectory (a finished task the store still retains cannot be
   * compacted away), or admission would be refused until a new task finished, which admission no longer lets happen.
   */
  dropOldestFinished(): number {
    const count = Math.min(this.finished.size, Math.max(1, Math.ceil(this.finished.size / 8)));
    for (let i = 0; i < count; i++) {
      const [oldest, size] = this.finished.entries().next().value!;
      this.finished.delete(oldest);
      this.finishedBytes -= size;
      this.totalBytes -= size;
      this.tasks.delete(oldest);
    }
    return count;
  }

  /** Estimated bytes held by finished tasks. */
  get retainedBytes(): number {
    return this.finishedBytes;
  }

  /** Estimated bytes held by every task, running ones included (their specs and finished samples). */
  get bytes(): number {
    return this.totalBytes;
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

/**
 * A TaskSpec's canonical form as sent (proto3 JSON, keys sorted at every depth), for a task that cannot be resolved:
 * two specs that differ only in the order of their Struct or map entries give the same string.
 */
export function specFingerprint(spec: TaskSpec): string {
  return `spec:${canonicalJson(TaskSpec.toJSON(spec))}`;
}

/**
 * A task's spec in memory: the canonical JSON (two bytes a character: V8 may store it one-byte, the bound errs
 * high) and the validated instance object beside it, about as large again.
 */
function specBytes(task: StoredTask): number {
  return 512 + 4 * task.fingerprint.length;
}

/** One stored trajectory in memory: its bytes (off the V8 heap) and the small object holding them. */
function storedBytes(stored: StoredTrajectory): number {
  return 128 + stored.bytes.byteLength;
}
