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
}

/**
 * Rebuilds the server's state from the journal before it serves: every session it knew, detached and resumable,
 * holding its unacknowledged trajectories; every accepted task in the task store (so Submit answers duplicate and
 * GetTrajectory finds it), with its finished trajectories as they were delivered and its unfinished samples queued
 * to run again from the same spec. A task that no longer validates is not dropped silently: its unfinished
 * samples end INVALID_TASK with the reason, journaled and delivered like any trajectory.
 */
export function recoverFromJournal(contents: JournalContents, deps: RecoveryDeps): RecoveryReport {
  const { runtime, sessions, registry, config, journal } = deps;
  const log = deps.logger.child({ component: 'recovery' });
  const report: RecoveryReport = { sessions: contents.sessions.length, tasks: 0, finishedSamples: 0, unackedSamples: 0, requeuedSamples: 0, invalidTasks: 0 };
  const byId = new Map<string, Session>();
  for (const id of contents.sessions) byId.set(id, sessions.restore(id));
  for (const record of contents.tasks) {
    report.tasks++;
    const spec = TaskSpec.decode(record.spec);
    const session = byId.get(record.session);
    session?.expect(record.taskId, record.numSamples);
    const finished = new Map<number, Trajectory>();
    for (const [i, bytes] of record.finished) finished.set(i, wireSafe(Trajectory.decode(bytes), config.maxMessageBytes));
    report.finishedSamples += finished.size;
    report.unackedSamples += [...finished.keys()].filter((i) => !record.acked.has(i)).length;
    let task;
    try {
      task = validateTask(spec, registry, config);
    } catch (err) {
      report.invalidTasks++;
      const reason = `after a server restart the task could not be run again: ${RolloutError.from(err).message}`;
      log.error({ taskId: record.taskId, err }, 'journaled task no longer validates');
      for (const t of finished.values()) session?.sink(t);
      for (let i = 0; i < record.numSamples; i++) {
        if (finished.has(i)) continue;
        const t = wireSafe(
          Trajectory.fromPartial({ taskId: record.taskId, sampleIndex: i, groupId: spec.groupId, environment: spec.environment, status: TrajectoryStatus.TRAJECTORY_STATUS_INVALID_TASK, finishReason: 'error', error: reason, metadata: spec.metadata }),
          config.maxMessageBytes,
        );
        void journal.finished(record.taskId, i, Trajectory.encode(t).finish()).catch((e: unknown) => log.error({ err: e }, 'journal write failed'));
        session?.sink(t);
      }
      acknowledge(session, record.taskId, record.acked);
      continue;
    }
    runtime.restore(task, finished, session ? [session.sink] : []);
    report.requeuedSamples += record.numSamples - finished.size;
    acknowledge(session, record.taskId, record.acked);
  }
  log.info(report, 'recovered from the journal');
  return report;
}

/** Marks what the client had acknowledged before the crash, so resume does not send it again. */
function acknowledge(session: Session | undefined, taskId: string, acked: ReadonlySet<number>): void {
  if (session && acked.size > 0) session.ack({ taskIds: [], trajectories: [...acked].map((sampleIndex) => ({ taskId, sampleIndex })) });
}
