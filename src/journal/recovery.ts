import type { ServerConfig } from '../config.js';
import type { EnvironmentRegistry } from '../environments/registry.js';
import type { Logger } from '../observability/logger.js';
import type { RolloutRuntime } from '../runtime.js';
import type { Session } from '../contract/session.js';
import type { SessionManager } from '../contract/sessions.js';
import { validateTask } from '../pipeline/validate-task.js';
import { wireSafe } from '../pipeline/wire-safe.js';
import { RolloutError } from '../errors.js';
import type { TrajectorySink } from '../pipeline/task.js';
import { TaskSpec, Trajectory, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { errorText } from './error-text.js';
import type { Journal, JournalContents } from './journal.js';
import type { LostDebt, LostTask } from './records.js';

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
  /** Finished samples not acknowledged, counted per session owed them: what resumed sessions will get at once. */
  unackedSamples: number;
  /** Samples queued to run again (same spec, same seeds). */
  requeuedSamples: number;
  /** Tasks that no longer validate (e.g. their environment is gone): their unfinished samples end INVALID_TASK. */
  invalidTasks: number;
  /** Records that could not be read (a partial or hand edit, another version): moved aside to `['x', ...key]`. */
  quarantinedRecords: number;
  /** Tasks whose record could not be read at this start: the sessions they were owed to are sent a failed trajectory per sample. */
  lostTasks: number;
  /** Failed trajectories of lost tasks (this start's and earlier ones') owed to sessions that had not acked them. */
  lostSamples: number;
}

/**
 * Rebuilds the server's state from the journal before it serves: every session it knew, detached and resumable,
 * holding its unacknowledged trajectories — of the tasks it submitted and of those it was answered `accepted` for as
 * a duplicate (the journal's owners); every accepted task in the task store (so Submit answers duplicate and
 * GetTrajectory finds it), with its finished trajectories as they were delivered and its unfinished samples queued
 * to run again from the same spec. A task that no longer validates is not dropped silently: its unfinished
 * samples end INVALID_TASK with the reason, journaled, delivered to the sessions it is owed to and kept in the task
 * store like any finished task (a re-submit of it is a duplicate).
 *
 * Acked samples are never handed to a session: each session's acks are replayed first, and its sink only gets the
 * samples it did not ack (another session's ack settles nothing of its debt). A sample acked whose trajectory the
 * journal lacks (its write failed, e.g. a transient ENOSPC, after it was delivered) is done: the client has it, so it
 * is not run again — unless a live session it is owed to did not ack it. A record that does not decode is moved aside
 * (Journal.quarantine), logged and counted; the rest is recovered.
 */
export function recoverFromJournal(contents: JournalContents, deps: RecoveryDeps): RecoveryReport {
  const { runtime, sessions, registry, config, journal } = deps;
  const log = deps.logger.child({ component: 'recovery' });
  const report: RecoveryReport = { sessions: contents.sessions.length, tasks: 0, finishedSamples: 0, unackedSamples: 0, requeuedSamples: 0, invalidTasks: 0, quarantinedRecords: 0, lostTasks: 0, lostSamples: 0 };
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
    // Every session the task is owed to (its submitter's, then each later owner's), with the samples it acked.
    const debts = [[record.session, record.acked] as const, ...record.owners];
    report.finishedSamples += finished.size;
    const sinks: TrajectorySink[] = [];
    const live: ReadonlySet<number>[] = [];
    for (const [id, acked] of debts) {
      const session = byId.get(id);
      if (!session) continue;
      session.expect(record.taskId, record.numSamples);
      acknowledge(session, record.taskId, acked);
      sinks.push((t: Trajectory): void => (acked.has(t.sampleIndex) ? undefined : session.sink(t)));
      live.push(acked);
      report.unackedSamples += [...finished.keys()].filter((i) => !acked.has(i)).length;
    }
    // Acked without a trajectory (its write failed after it was delivered): the client has it; it counts as done (not
    // run, not delivered again) — unless a live session it is owed to has not acked it: that one still needs it.
    const ackedOnly = [...new Set(debts.flatMap(([, acked]) => [...acked]))].filter((i) => !finished.has(i) && live.every((acked) => acked.has(i)));
    // GetTrajectory still answers for an acked-only sample (never sent to a session: each one owed it acked it).
    const lost = (i: number): Trajectory =>
      Trajectory.fromPartial({
        taskId: record.taskId,
        sampleIndex: i,
        groupId: spec.groupId,
        environment: spec.environment,
        status: TrajectoryStatus.TRAJECTORY_STATUS_UNSPECIFIED,
        finishReason: 'error',
        error: `after a server restart: the client acknowledged this sample, but its trajectory was not journaled (its write failed), so it is not kept`,
        metadata: spec.metadata,
      });
    for (const i of ackedOnly) finished.set(i, lost(i));
    let task;
    try {
      task = validateTask(spec, registry, config);
    } catch (err) {
      report.invalidTasks++;
      const reason = `after a server restart the task could not be run again: ${RolloutError.from(err).message}`;
      log.error({ taskId: record.taskId, err }, 'journaled task no longer validates');
      // Recorded like any finished task: GetTrajectory finds it, its sessions are owed its trajectories, and a
      // re-submit of its spec is its duplicate (TaskStore.unrunnable).
      runtime.restoreUnrunnable(spec, record.numSamples, finished, reason, sinks);
      continue;
    }
    report.requeuedSamples += record.numSamples - finished.size;
    runtime.restore(task, finished, sinks);
  }
  for (const lost of journal.lostTasks) logLost(lost, report, log);
  for (const debt of journal.owedLost()) tellLost(debt, byId, report, config.maxMessageBytes);
  report.quarantinedRecords = journal.quarantined;
  if (report.quarantinedRecords > 0) log.warn({ quarantined: report.quarantinedRecords }, 'journal records that could not be read were moved aside (key range [x, ...]); the rest was recovered');
  log.info(report, 'recovered from the journal');
  return report;
}

/** A task whose record could not be read at this start (quarantined: its spec and trajectories are gone): logged with its id and sessions, and counted. */
function logLost(lost: LostTask, report: RecoveryReport, log: Logger): void {
  report.lostTasks++;
  const { taskId, numSamples } = lost;
  log.error({ taskId, numSamples, sessions: [...lost.debts.keys()] }, numSamples === undefined ? 'a journaled task could not be read, nor how many samples it had: lost, its sessions cannot be told per sample' : 'a journaled task could not be read: its sessions are sent a failed trajectory per sample they had not acked');
}

/**
 * A lost task is not dropped silently: each session it was owed to is sent, for every sample it had not acked, a
 * trajectory with status ENVIRONMENT_ERROR (a server-side failure, never a result: a trainer filters it out) saying
 * why and to submit it again — its id is free (the task store does not hold it). The journal keeps that debt
 * (Journal.owedLost) until the session acks each or ends, so a later crash tells it again, the same trajectories.
 */
function tellLost(debt: LostDebt, byId: ReadonlyMap<string, Session>, report: RecoveryReport, maxMessageBytes: number): void {
  const { taskId, numSamples, error, acked } = debt;
  const session = byId.get(debt.session);
  if (!session) return;
  session.expect(taskId, numSamples);
  acknowledge(session, taskId, acked);
  for (let i = 0; i < numSamples; i++) {
    if (acked.has(i)) continue;
    report.lostSamples++;
    session.sink(wireSafe(Trajectory.fromPartial({ taskId, sampleIndex: i, status: TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR, finishReason: 'error', error }), maxMessageBytes));
  }
}

/** Marks what the client had acknowledged before the crash, so resume does not send it again. */
function acknowledge(session: Session | undefined, taskId: string, acked: ReadonlySet<number>): void {
  if (session && acked.size > 0) session.ack({ taskIds: [], trajectories: [...acked].map((sampleIndex) => ({ taskId, sampleIndex })) });
}
