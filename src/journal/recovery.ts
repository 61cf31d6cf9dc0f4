import type { ServerConfig } from '../config.js';
import type { EnvironmentRegistry } from '../environments/registry.js';
import type { Logger } from '../observability/logger.js';
import type { RolloutRuntime } from '../runtime.js';
import type { Session } from '../contract/session.js';
import type { SessionManager } from '../contract/sessions.js';
import { validateTask } from '../pipeline/validate-task.js';
import { wireSafe } from '../pipeline/wire-safe.js';
import { RolloutError } from '../errors.js';
import { TaskSpec, Trajectory, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import type { Journal, JournalContents } from './journal.js';

export interface RecoveryDeps {
  runtime: RolloutRuntime;
  sessions: SessionManager;
  registry: EnvironmentRegistry;
  config: ServerConfig;
  journal: Journal;
  logger: Logger;
}

/** What start-up recovery found and did (logged, and returned for tests). */
export interface RecoveryReport {
  sessions: number;
  tasks: number;
  /** Samples whose trajectory the journal held (delivered again on resume unless acked). */
  finishedSamples: number;
  /** Finished samples not acknowledged: what resumed sessions will get at once. */
  unackedSamples: number;
  /** Samples queued to run again (same spec, same seeds). */
  requeuedSamples: number;
  /** Tasks that no longer validate (e.g. their environment is gone): their unfinished samples end INVALID_TASK. */
  invalidTasks: number;
  /** Records that could not be read (a partial or hand edit, another version): moved aside to `['x', ...key]`. */
  quarantinedRecords: number;
}

/**
 * Rebuilds the server's state from the journal before it serves: every session it knew, detached and resumable,
 * holding its unacknowledged trajectories; every accepted task in the task store (so Submit answers duplicate and
 * GetTrajectory finds it), with its finished trajectories as they were delivered and its unfinished samples queued
 * to run again from the same spec. A task that no longer validates is not dropped silently: its unfinished
 * samples end INVALID_TASK with the reason, journaled and delivered like any trajectory.
 *
 * Acked samples are never handed to a session: the journal's acks are replayed first, and the session's sink only
 * gets the unacked ones. A sample acked whose trajectory the journal lacks (its write failed, e.g. a transient
 * ENOSPC, after it was delivered) is done: the client has it, so it is not run again. A record that does not decode
 * is moved aside (Journal.quarantine), logged and counted; the rest is recovered.
 */
export function recoverFromJournal(contents: JournalContents, deps: RecoveryDeps): RecoveryReport {
  const { runtime, sessions, registry, config, journal } = deps;
  const log = deps.logger.child({ component: 'recovery' });
  const report: RecoveryReport = { sessions: contents.sessions.length, tasks: 0, finishedSamples: 0, unackedSamples: 0, requeuedSamples: 0, invalidTasks: 0, quarantinedRecords: 0 };
  const byId = new Map<string, Session>();
  for (const id of contents.sessions) byId.set(id, sessions.restore(id));
  for (const record of contents.tasks) {
    let spec: TaskSpec;
    try {
      spec = TaskSpec.decode(record.spec);
    } catch (err) {
      journal.quarantine(['t', record.taskId], `its TaskSpec does not decode: ${errorText(err)}`);
      continue;
    }
    report.tasks++;
    const finished = new Map<number, Trajectory>();
    for (const [i, bytes] of record.finished) {
      try {
        const t = Trajectory.decode(bytes);
        if (t.taskId !== record.taskId || t.sampleIndex !== i) throw new Error(`it holds ${t.taskId}/${t.sampleIndex}`);
        finished.set(i, wireSafe(t, config.maxMessageBytes));
      } catch (err) {
        // The sample runs again (same spec, same seed) unless the client acked it.
        journal.quarantine(['r', record.taskId, i], `its trajectory does not decode: ${errorText(err)}`);
      }
    }
    // Acked without a trajectory: the client has it; it counts as done (not run, not delivered again).
    const ackedOnly = [...record.acked].filter((i) => !finished.has(i));
    report.finishedSamples += finished.size;
    report.unackedSamples += [...finished.keys()].filter((i) => !record.acked.has(i)).length;
    const session = byId.get(record.session);
    session?.expect(record.taskId, record.numSamples);
    acknowledge(session, record.taskId, record.acked);
    const sink = session && ((t: Trajectory): void => (record.acked.has(t.sampleIndex) ? undefined : session.sink(t)));
    let task;
    try {
      task = validateTask(spec, registry, config);
    } catch (err) {
      report.invalidTasks++;
      const reason = `after a server restart the task could not be run again: ${RolloutError.from(err).message}`;
      log.error({ taskId: record.taskId, err }, 'journaled task no longer validates');
      for (const t of finished.values()) sink?.(t);
      for (let i = 0; i < record.numSamples; i++) {
        if (finished.has(i) || record.acked.has(i)) continue;
        const t = wireSafe(
          Trajectory.fromPartial({ taskId: record.taskId, sampleIndex: i, groupId: spec.groupId, environment: spec.environment, status: TrajectoryStatus.TRAJECTORY_STATUS_INVALID_TASK, finishReason: 'error', error: reason, metadata: spec.metadata }),
          config.maxMessageBytes,
        );
        void journal.finished(record.taskId, i, Trajectory.encode(t).finish()).catch((e: unknown) => log.error({ err: e }, 'journal write failed'));
        sink?.(t);
      }
      continue;
    }
    report.requeuedSamples += record.numSamples - finished.size - ackedOnly.length;
    // GetTrajectory still answers for an acked-only sample (never sent to the session: it is acked).
    for (const i of ackedOnly) {
      const lost = `after a server restart: the client acknowledged this sample, but its trajectory was not journaled (its write failed), so it is not kept`;
      finished.set(i, Trajectory.fromPartial({ taskId: record.taskId, sampleIndex: i, groupId: spec.groupId, environment: spec.environment, status: TrajectoryStatus.TRAJECTORY_STATUS_UNSPECIFIED, finishReason: 'error', error: lost, metadata: spec.metadata }));
    }
    runtime.restore(task, finished, sink ? [sink] : []);
  }
  report.quarantinedRecords = journal.quarantined;
  if (report.quarantinedRecords > 0) log.warn({ quarantined: report.quarantinedRecords }, 'journal records that could not be read were moved aside (key range [x, ...]); the rest was recovered');
  log.info(report, 'recovered from the journal');
  return report;
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Marks what the client had acknowledged before the crash, so resume does not send it again. */
function acknowledge(session: Session | undefined, taskId: string, acked: ReadonlySet<number>): void {
  if (session && acked.size > 0) session.ack({ taskIds: [], trajectories: [...acked].map((sampleIndex) => ({ taskId, sampleIndex })) });
}
