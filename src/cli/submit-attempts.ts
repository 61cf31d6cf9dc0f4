import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';

/**
 * Attempts of a dataset row for `rollout submit --retries N`.
 *
 * A row's first attempt is the task `ds-...` (submit-dataset.ts `taskIdFor`), attempt k ≥ 2 the task
 * `ds-...-attemptK`: every attempt is a new task id, so the server's idempotent submit keeps meaning "the same
 * attempt" (a re-run attaches to an attempt still running there, and never gets a failed attempt back instead of a new
 * one). The suffix cannot be confused with the row id's own content hash (hex digits only).
 *
 * What is retried: a group (all samples of an attempt) with any sample whose status is an infrastructure failure —
 * BACKEND_ERROR, SANDBOX_ERROR, ENVIRONMENT_ERROR, TIMEOUT, CANCELLED (a server shutting down), UNSPECIFIED. Never
 * a policy outcome (COMPLETED with any reward, TRUNCATED) nor INVALID_TASK (the row itself is wrong: a retry cannot
 * help). The whole group is retried, not the failed samples alone: GRPO normalises rewards within a group, so a group
 * made of samples from two attempts (two different engine states, a policy version apart after a weight sync) or a
 * group one short would bias the advantages; the trainer reads one group per row, always from one attempt.
 */

const ATTEMPT_SUFFIX = /^(.*)-attempt([1-9][0-9]*)$/;

export function attemptTaskId(rowTaskId: string, attempt: number): string {
  return attempt === 1 ? rowTaskId : `${rowTaskId}-attempt${attempt}`;
}

/** The row id and attempt number of a task id written by the runner (attempt 1 when it has no suffix). */
export function parseAttempt(taskId: string): { rowTaskId: string; attempt: number } {
  const m = ATTEMPT_SUFFIX.exec(taskId);
  return m ? { rowTaskId: m[1]!, attempt: Number(m[2]) } : { rowTaskId: taskId, attempt: 1 };
}

const NOT_RETRIED = new Set<string>(['TRAJECTORY_STATUS_COMPLETED', 'TRAJECTORY_STATUS_TRUNCATED', 'TRAJECTORY_STATUS_INVALID_TASK']);

/** Whether a status (by its protobuf JSON name) is an infrastructure failure that a new attempt may not have. */
export function isRetryableStatusName(name: string): boolean {
  return !NOT_RETRIED.has(name);
}

export function isRetryableStatus(status: TrajectoryStatus): boolean {
  return isRetryableStatusName(TrajectoryStatus[status] ?? String(status));
}

/** The attempts of one row found in the output and in the retried attempts beside it. */
export interface RowAttempts {
  /** The latest attempt in the output, and how many of its samples are there. */
  latest?: { attempt: number; samples: number; failed: boolean };
  /** The highest attempt moved beside the output (superseded by a retry), 0 when none. */
  superseded: number;
}

/**
 * Groups what an output and its retried file hold by row. `failed` are the task ids of the output with an
 * infrastructure failure (TrajectoryOutput.failed).
 */
export function attemptsByRow(
  written: ReadonlyMap<string, ReadonlySet<number>>,
  failed: ReadonlySet<string>,
  retried: ReadonlyMap<string, ReadonlySet<number>>,
): Map<string, RowAttempts> {
  const rows = new Map<string, RowAttempts>();
  const row = (id: string): RowAttempts => rows.get(id) ?? (rows.set(id, { superseded: 0 }), rows.get(id)!);
  for (const [taskId, samples] of written) {
    const { rowTaskId, attempt } = parseAttempt(taskId);
    const r = row(rowTaskId);
    if (r.latest === undefined || attempt > r.latest.attempt) r.latest = { attempt, samples: samples.size, failed: failed.has(taskId) };
  }
  for (const taskId of retried.keys()) {
    const { rowTaskId, attempt } = parseAttempt(taskId);
    const r = row(rowTaskId);
    r.superseded = Math.max(r.superseded, attempt);
  }
  return rows;
}

/**
 * Task ids of the output that a later attempt of the same row supersedes (a run retried a row whose group failed in
 * an earlier run): they are moved beside the output when it closes.
 */
export function supersededTasks(written: ReadonlyMap<string, ReadonlySet<number>>): Set<string> {
  const latest = new Map<string, number>();
  for (const taskId of written.keys()) {
    const { rowTaskId, attempt } = parseAttempt(taskId);
    latest.set(rowTaskId, Math.max(latest.get(rowTaskId) ?? 0, attempt));
  }
  const out = new Set<string>();
  for (const taskId of written.keys()) {
    const { rowTaskId, attempt } = parseAttempt(taskId);
    if (attempt < latest.get(rowTaskId)!) out.add(taskId);
  }
  return out;
}

/** What to do with a row at the start of a run. */
export type RowPlan = { kind: 'done' } | { kind: 'exhausted'; attempt: number } | { kind: 'submit'; attempt: number };

/**
 * The plan for a row: done when its latest group in the output is whole and has no infrastructure failure (or has
 * one and `maxAttempts` are used: exhausted); otherwise the attempt to submit — the latest one again when its group
 * is not whole in the output (the server attaches to it, or runs it if it forgot it), else the next.
 */
export function planRow(found: RowAttempts | undefined, numSamples: number, maxAttempts: number): RowPlan {
  const latest = found?.latest;
  const superseded = found?.superseded ?? 0;
  if (latest !== undefined && latest.attempt > superseded) {
    if (latest.samples < numSamples) return { kind: 'submit', attempt: latest.attempt };
    if (!latest.failed) return { kind: 'done' };
    return latest.attempt < maxAttempts ? { kind: 'submit', attempt: latest.attempt + 1 } : { kind: 'exhausted', attempt: latest.attempt };
  }
  // Only superseded attempts (a run killed between moving a group aside and writing the next one), or none.
  const next = superseded + 1;
  return next <= maxAttempts || superseded === 0 ? { kind: 'submit', attempt: next } : { kind: 'exhausted', attempt: superseded };
}
