import { DEFAULT_RETRIES, DEFAULT_RETRY_REFUSED_FOR_S } from './submit-defaults.js';
import { connect, connectionOptions, withinConnectTimeout, type ConnectionFlags } from './connection.js';
import cliProgress from 'cli-progress';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { TaskRejectedError } from '../client/rollout-client.js';
import { RolloutError } from '../errors.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { statusName } from '../pipeline/outcome.js';
import { attemptTaskId, attemptsByRow, isRetryableStatus, parseAttempt, planRow, supersededTasks } from './submit-attempts.js';
import { countRows, datasetTag, mapRow, readDataset, taskIdFor, type MappedRow } from './submit-dataset.js';
import { HeldGroups } from './submit-held.js';
import { isParquetOutput, openTrajectoryOutput, type TrajectoryOutput } from './submit-output.js';
import { forTerminal } from './terminal-text.js';
import { ignoreGoneTerminal, StopSignals } from './stop-signals.js';

export interface SubmitOptions extends ConnectionFlags {
  dataset: string;
  environment: string;
  numSamples: number;
  server: string;
  /** Default `<dataset>.trajectories.jsonl`. */
  output?: string;
  instanceField?: string;
  /** Tasks in flight at once (each is `numSamples` trajectories). */
  concurrency: number;
  temperature?: number;
  maxTokensPerTurn?: number;
  maxTotalTokens?: number;
  /**
   * New attempts a row gets when its group has an infrastructure failure (submit-attempts.ts); 0 disables. Counted
   * across runs on one output: a re-run continues from the attempts the output and its retried file record.
   */
  retries?: number;
  /**
   * Seconds a task the server refuses for now (TaskRejectedError.retryable: RESOURCE_EXHAUSTED, UNAVAILABLE - starting,
   * draining, delivery paused, its journal failing a write) is submitted again, with backoff, before its row counts as
   * an infrastructure failure (exit 3). Default {@link DEFAULT_RETRY_REFUSED_FOR_S}.
   */
  retryRefusedFor?: number;
  /** Where progress goes (default stderr); tests pass a stream. */
  progress?: NodeJS.WriteStream;
}

/** Exit code of a run cut short by the server or the network rather than by the data (2 is a usage mistake). */
const EXIT_INFRASTRUCTURE = 3;


/** Backoff between the submits of a task refused for now: the first delay, doubling to the cap (ms). */
const REFUSED_FIRST_MS = 50;
const REFUSED_CAP_MS = 2000;


/** A counting semaphore for tasks in flight. */
class Slots {
  private free: number;
  private readonly waiters: Array<() => void> = [];
  constructor(size: number) {
    this.free = size;
  }
  async take(): Promise<void> {
    if (this.free > 0) {
      this.free--;
      return;
    }
    await new Promise<void>((resolve) => this.waiters.push(resolve));
  }
  give(): void {
    const next = this.waiters.shift();
    if (next) next();
    else this.free++;
  }
  /** Wakes every waiter (used on interrupt, so the submit loop can see it and stop). */
  release(): void {
    for (const w of this.waiters.splice(0)) w();
  }
}

/**
 * `rollout submit --dataset FILE`: streams the dataset's rows (JSONL or Parquet, see submit-dataset.ts) to a server
 * over one Rollout stream with at most `concurrency` tasks in flight, writes each trajectory as it arrives
 * (submit-output.ts) and shows progress with running reward mean and status counts (a bar on a terminal, a line
 * every 2 s otherwise).
 *
 * Resuming: task ids are derived from the dataset path, row index and row content, so a re-run of the same command
 * skips every row whose samples are all in the output, and resubmits the rest; the server's submit is idempotent on
 * task id, so a task still running there (or finished but never received) is attached to, not run again, and
 * samples already written are not written twice. SIGINT/SIGTERM/SIGHUP (the terminal hung up) stop submitting, close
 * the output between two lines and exit 130 (143, 129); re-run to finish.
 *
 * Returns the exit code: 0 when every row's trajectories are in the output, 1 when some rows were rejected (bad
 * instance) or could not be read or mapped (the data: fix those rows), 3 when the server could not be reached or the
 * stream failed or the output could not be written (a full disk: infrastructure, nothing is wrong with the data, free
 * space and re-run to resume), 128 + the signal's number when interrupted.
 */
export async function runSubmit(opts: SubmitOptions): Promise<number> {
  if (!existsSync(opts.dataset)) throw new RolloutError('invalid_argument', `dataset ${opts.dataset} does not exist`);
  if (!Number.isInteger(opts.numSamples) || opts.numSamples < 1) throw new RolloutError('invalid_argument', '--num-samples must be a positive integer');
  if (!Number.isInteger(opts.concurrency) || opts.concurrency < 1) throw new RolloutError('invalid_argument', '--concurrency must be a positive integer');
  const retries = opts.retries ?? DEFAULT_RETRIES;
  if (!Number.isInteger(retries) || retries < 0) throw new RolloutError('invalid_argument', '--retries must be a non-negative integer');
  const maxAttempts = 1 + retries;
  const retryRefusedForMs = (opts.retryRefusedFor ?? DEFAULT_RETRY_REFUSED_FOR_S) * 1000;
  if (!Number.isFinite(retryRefusedForMs) || retryRefusedForMs < 0) throw new RolloutError('invalid_argument', '--retry-refused-for must be a non-negative number of seconds');
  const outputPath = opts.output ?? `${opts.dataset.replace(/\.(jsonl|json|parquet|pq)$/i, '')}.trajectories.jsonl`;
  const retriedPath = `${outputPath}.retried.jsonl`;
  const out = opts.progress ?? process.stderr;
  const total = await countRows(opts.dataset);
  // Flags checked before the output is opened (and locked), so a mistake in them leaves no lock behind.
  const client = connect(opts.server, '--server', connectionOptions(opts));
  const output = await openTrajectoryOutput(outputPath).catch((err: unknown) => {
    client.close();
    throw err;
  });
  /** Superseded attempts, beside the output; opened when there is one to keep (or some from an earlier run). */
  let retriedOutput: TrajectoryOutput | undefined;
  try {
    if (existsSync(retriedPath)) retriedOutput = await openTrajectoryOutput(retriedPath);
  } catch (err) {
    client.close();
    await output.close(false);
    throw err;
  }
  const retried = async (): Promise<TrajectoryOutput> => (retriedOutput ??= await openTrajectoryOutput(retriedPath));
  const found = attemptsByRow(output.written, output.failed, retriedOutput?.written ?? new Map<string, ReadonlySet<number>>());
  try {
    await refuseChangedRows(opts, outputPath, [...output.written.keys()].map((id) => parseAttempt(id).rowTaskId));
  } catch (err) {
    client.close();
    await output.close(false);
    await retriedOutput?.close(false);
    throw err;
  }
  /** The samples of each attempt in flight, held on disk until its group is whole (submit-held.ts). */
  let held: HeldGroups;
  try {
    held = new HeldGroups(`${output.journal}.held`);
  } catch (err) {
    client.close();
    await output.close(false);
    await retriedOutput?.close(false);
    throw err;
  }
  // Refusals come back at once: submit retries them itself, as a whole group, for --retry-refused-for.
  const session = client.openSession({ sessionId: `submit-${randomUUID()}`, retryRejectedForMs: 0 });
  const slots = new Slots(opts.concurrency);

  const counts = new Map<string, number>();
  let rewardSum = 0;
  /** Trajectories that have a reward (COMPLETED, TRUNCATED): infrastructure failures stay out of the mean. */
  let scored = 0;
  let received = 0;
  let skipped = 0;
  let submitted = 0;
  let failedRows = 0;
  /** Attempts submitted this run beyond each row's first. */
  let retryCount = 0;
  /** Rows whose last allowed attempt still has an infrastructure failure (this run's, and earlier runs'). */
  let infraRows = 0;
  /** Submitting stops: SIGINT/SIGTERM/SIGHUP (`signals.signal`) or a write that failed (`writeError`, e.g. a full disk). */
  let stopping = false;
  /** The first write of the output, its retried file or a held group that failed: the run stops, never reports done. */
  let writeError: string | undefined;
  let streamError: string | undefined;
  /** Each attempt in flight, until its group is whole: then it is kept or retried as one. */
  const pending = new Map<string, Attempt>();
  /** Attempts the server refused for now, waiting to be submitted again: since when, the next delay, the timer. */
  const refused = new Map<string, { since: number; delayMs: number; timer?: NodeJS.Timeout }>();
  let refusals = 0;
  let lastRefusalLine = 0;
  const alreadyWritten = [...output.written.values()].reduce((n, s) => n + s.size, 0);
  if (output.tornBytes > 0) {
    // Said, not done silently: the line's sample is not in the output, and is fetched (or its group run) again.
    out.write(`[submit] ${output.journal}: cut off a torn last line (${output.tornBytes} bytes: a run killed mid-write); its sample is fetched again\n`);
  }

  const bar = out.isTTY
    ? new cliProgress.SingleBar(
        { format: 'trajectories {bar} {value}/{total} | reward {reward} | retries {retries} | {statuses}', stream: out, hideCursor: true, etaBuffer: 50 },
        cliProgress.Presets.shades_classic,
      )
    : undefined;
  const statuses = (): string => [...counts].map(([s, n]) => `${s} ${n}`).join(' ') || '-';
  const mean = (): string => (scored === 0 ? '-' : (rewardSum / scored).toFixed(3));
  let lastLine = 0;
  const report = (force = false): void => {
    if (bar) {
      bar.update(alreadyWritten + received, { reward: mean(), retries: retryCount, statuses: statuses() });
      return;
    }
    if (!force && Date.now() - lastLine < 2000) return;
    lastLine = Date.now();
    const retryPart = retryCount > 0 ? ` | retries ${retryCount}` : '';
    out.write(`[submit] ${alreadyWritten + received}/${total * opts.numSamples} trajectories | reward mean ${mean()}${retryPart} | ${statuses()}\n`);
  };

  const halt = (): void => {
    stopping = true;
    for (const r of refused.values()) clearTimeout(r.timer);
    slots.release();
    session.abort();
  };
  const onLateSignal = (): void => {
    logAbove(bar, out, `[submit] finishing the output first (interrupt again to stop at once: ${outputPath}'s journal keeps what arrived)`);
  };
  /**
   * A write failed (ENOSPC, EIO, a size limit): the run stops as on SIGINT, so no further group is written after a
   * line that could not be; what is in the output stays, a group it holds in part is replaced whole by the re-run.
   */
  const writeFailed = (err: unknown): void => {
    if (writeError !== undefined) return;
    writeError = (err as Error).message;
    logAbove(bar, out, `[submit] stopping: ${writeError}`);
    halt();
  };
  /**
   * The stream failed (the server went away, the network broke): no row is submitted after it (each would be refused
   * at once by the dead session and counted as bad data), and a wait for a slot that no group will free ends.
   */
  const streamFailed = (err: unknown): void => {
    streamError ??= (err as Error).message;
    halt();
  };
  // The first signal stops submitting; a second (but a repeated hang-up) exits at once: the journal keeps what arrived.
  ignoreGoneTerminal();
  const signals = new StopSignals(halt);
  let lateSignals: StopSignals | undefined;

  const submitAttempt = (row: RowContext, attempt: number): void => {
    const taskId = attemptTaskId(row.rowTaskId, attempt);
    pending.set(taskId, { row, attempt });
    session
      .submit({
        taskId,
        groupId: taskId,
        environment: opts.environment,
        numSamples: opts.numSamples,
        instance: row.instance,
        metadata: row.metadata,
        ...(sampling(opts) && { sampling: sampling(opts) }),
      })
      .then(
        () => void refused.delete(taskId),
        (err: unknown) => {
          if (!stopping && err instanceof TaskRejectedError && err.retryable && submitLater(row, attempt, err)) return;
          refused.delete(taskId);
          held.release(taskId);
          if (pending.delete(taskId)) slots.give();
          progressed();
          if (stopping) return;
          if (!(err instanceof TaskRejectedError)) {
            // Not the server's verdict on the row (a spec that cannot be encoded is a TaskRejectedError too): the
            // stream ended under it. Infrastructure, never "rejected": a re-run resubmits the row.
            streamFailed(err);
            return;
          }
          if (err.retryable) {
            // Not the data's fault: the server kept refusing. A re-run resubmits the row.
            infraRows++;
            logAbove(bar, out, `[submit] row ${row.index} (${taskId}) still refused after ${Math.round(retryRefusedForMs / 1000)} s (--retry-refused-for): ${rejection(err)}`);
            return;
          }
          failedRows++;
          logAbove(bar, out, `[submit] ${at(opts, row.line)}row ${row.index} (${taskId}) rejected: ${rejection(err)}`);
        },
      );
  };

  /**
   * A task the server refused for now (starting, draining, busy, this session's delivery paused, its journal failing a
   * write): submitted again, the same task id, after a backoff (50 ms doubling to 2 s), while --retry-refused-for lasts;
   * its slot stays taken meanwhile, so the run does not outrun the server. False once that time is up.
   */
  const submitLater = (row: RowContext, attempt: number, err: TaskRejectedError): boolean => {
    const taskId = attemptTaskId(row.rowTaskId, attempt);
    const now = Date.now();
    const r = refused.get(taskId) ?? { since: now, delayMs: REFUSED_FIRST_MS };
    if (now + r.delayMs - r.since > retryRefusedForMs) return false;
    refusals++;
    if (now - lastRefusalLine >= 2000) {
      lastRefusalLine = now;
      logAbove(bar, out, `[submit] the server refuses tasks for now (${rejection(err)}); submitting them again with backoff (${refusals} refusals so far)`);
    }
    r.timer = setTimeout(() => {
      if (stopping) return;
      submitAttempt(row, attempt);
    }, r.delayMs);
    r.delayMs = Math.min(r.delayMs * 2, REFUSED_CAP_MS);
    refused.set(taskId, r);
    return true;
  };

  /** A whole group: kept in the output, or (an infrastructure failure, attempts left) moved aside and retried. */
  const settle = async (taskId: string, group: Attempt): Promise<void> => {
    if (writeError !== undefined) {
      held.release(taskId); // not written after a failed write: the re-run fetches it again
      return;
    }
    const heldSamples = [...held.samples(taskId).values()];
    const failures = heldSamples.filter((t) => isRetryableStatus(t.status));
    const causes = [...new Set(failures.map((t) => `${statusName(t.status)}: ${t.error || t.finishReason || 'no cause given'}`))].join('; ');
    // Read back one sample at a time: a whole group of long samples is not held in memory at once.
    const samples = function* (): Generator<Trajectory> {
      for (const t of held.read(taskId)) yield stamped(t, group.attempt);
    };
    if (failures.length > 0 && group.attempt < maxAttempts && !stopping) {
      const aside = await retried();
      // Samples of this group a killed run had written already leave the output with the rest of it.
      output.remove(new Set([taskId]), (t) => aside.write(stamped(t, group.attempt)));
      for (const t of samples()) aside.write(t);
      held.release(taskId);
      retryCount++;
      logAbove(bar, out, `[submit] row ${group.row.index} attempt ${group.attempt}: ${failures.length} of ${heldSamples.length} samples failed (${causes}); retrying as attempt ${group.attempt + 1}`);
      report();
      submitAttempt(group.row, group.attempt + 1);
      return;
    }
    // Samples of this task a killed run (or a full disk) left in the output are not a group: they are dropped, and this
    // group is written whole, so a task the server forgot and ran again never mixes samples of two runs in one group.
    if (output.written.has(taskId)) output.remove(new Set([taskId]), () => undefined);
    for (const t of samples()) {
      if (!output.write(t)) continue;
      received++;
      if (t.status === TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED || t.status === TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED) {
        scored++;
        rewardSum += t.reward;
      }
      counts.set(statusName(t.status), (counts.get(statusName(t.status)) ?? 0) + 1);
    }
    held.release(taskId);
    if (failures.length > 0 && !stopping) {
      infraRows++;
      logAbove(bar, out, `[submit] row ${group.row.index} (${taskId}): infrastructure failures remain after ${group.attempt} attempts: ${causes}`);
    }
    report();
    slots.give();
  };

  /** Settling is serialised: moving a group aside rewrites the output, which no other write may interleave with. */
  let settling = Promise.resolve();
  let unsettled = 0;
  /** Wakes the wait for the last groups (a group settled, a submit was refused). */
  let progressed: () => void = () => undefined;
  const receive = (t: Trajectory): void => {
    const group = pending.get(t.taskId);
    if (group === undefined) return; // not one of this run's attempts (cannot happen on a session of its own)
    if (!Number.isInteger(t.sampleIndex) || t.sampleIndex < 0 || t.sampleIndex >= opts.numSamples) {
      // A faulty server's: counted, it would make the group whole in place of one of its own samples.
      logAbove(bar, out, `[submit] row ${group.row.index} (${t.taskId}): dropped a trajectory with sample_index ${t.sampleIndex} outside [0, ${opts.numSamples})`);
      return;
    }
    try {
      held.hold(t);
    } catch (err) {
      writeFailed(err);
      return;
    }
    if (held.samples(t.taskId).size < opts.numSamples) return;
    pending.delete(t.taskId);
    unsettled++;
    settling = settling
      .then(() => settle(t.taskId, group))
      .catch(writeFailed)
      .finally(() => {
        unsettled--;
        progressed();
      });
  };

  let streamEnded = false;
  const receiving = (async () => {
    try {
      for await (const t of session.trajectories()) receive(t);
    } catch (err) {
      if (!stopping) {
        streamFailed(err);
        throw err;
      }
    } finally {
      streamEnded = true;
      await settling;
    }
  })();
  // Awaited below; a stream that fails first (no server) fails `opened` too, which is what is reported then.
  receiving.catch(() => undefined);
  bar?.start(total * opts.numSamples, alreadyWritten, { reward: mean(), retries: retryCount, statuses: statuses() });
  if (!bar) out.write(`[submit] ${opts.dataset}: ${total} rows × ${opts.numSamples} samples → ${outputPath} (server ${opts.server}, up to ${retries} retries a row)\n`);
  try {
    await withinConnectTimeout(client.rollout, opts.server, opts, session.opened).catch((err: unknown) => {
      session.abort();
      throw err instanceof RolloutError ? new Error(err.message) : err; // a stream failure, reported as one
    });
    for await (const row of readDataset(opts.dataset)) {
      if (stopping) break;
      if ('problem' in row) {
        failedRows++;
        logAbove(bar, out, `[submit] row ${row.index} skipped: ${row.problem}`);
        continue;
      }
      let context: RowContext;
      try {
        const mapped = mapRow(row, opts.environment, opts.instanceField);
        context = { index: row.index, line: row.line, rowTaskId: rowTaskIdFor(opts, row.index, mapped), ...mapped };
      } catch (err) {
        failedRows++;
        logAbove(bar, out, `[submit] ${at(opts, row.line)}row ${row.index} skipped: ${(err as Error).message}`);
        continue;
      }
      const plan = planRow(found.get(context.rowTaskId), opts.numSamples, maxAttempts);
      if (plan.kind === 'done') {
        skipped++;
        continue;
      }
      if (plan.kind === 'exhausted') {
        infraRows++;
        // A run stopped between moving this group aside and getting the next attempt's (and this one allows no more):
        // the group goes back, so that a row whose attempts are used up keeps its last group in the output.
        const last = attemptTaskId(context.rowTaskId, plan.attempt);
        try {
          if (!output.written.has(last) && retriedOutput?.written.has(last)) retriedOutput.remove(new Set([last]), (t) => output.write(t));
        } catch (err) {
          writeFailed(err);
          break;
        }
        logAbove(bar, out, `[submit] row ${row.index} (${last}): infrastructure failures remain after ${plan.attempt} attempts (allow more with --retries)`);
        continue;
      }
      await slots.take();
      if (stopping) break;
      submitted++;
      if (plan.attempt > 1) retryCount++;
      submitAttempt(context, plan.attempt);
    }
    // Retries are submitted as groups settle, so the session stays open until no attempt is left in flight.
    while ((pending.size > 0 || unsettled > 0) && !stopping && !streamEnded) {
      await Promise.race([new Promise<void>((resolve) => (progressed = resolve)), receiving]);
    }
    session.close();
    await receiving;
  } catch (err) {
    // The server went away or refused the stream: what arrived is in the output; a re-run resumes.
    if (err instanceof RolloutError) throw err;
    streamError = (err as Error).message;
  } finally {
    signals.dispose();
    // From here on the output is finished (the Parquet file written from the journal): an interrupt waits for that
    // instead of killing the process half-way through a write; a second one stops at once (a re-run resumes).
    lateSignals = new StopSignals(onLateSignal);
    for (const r of refused.values()) clearTimeout(r.timer); // a stream that ended with resubmits still waiting
    await settling;
    held.close();
    report(true);
    bar?.stop();
    client.close();
  }
  // A row retried after an earlier run had kept its failed group: that group leaves the output for the retried file.
  const stale = writeError === undefined ? supersededTasks(output.written) : new Set<string>();
  try {
    if (stale.size > 0) {
      const aside = await retried();
      output.remove(stale, (t) => aside.write(stamped(t, parseAttempt(t.taskId).attempt)));
    }
  } catch (err) {
    writeFailed(err);
  }
  const complete = !stopping && failedRows === 0 && streamError === undefined;
  try {
    await output.close(complete); // a Parquet output is written here
  } catch (err) {
    writeFailed(err);
  }
  await retriedOutput?.close(false);
  // The Parquet file is written synchronously: a signal that came during the write waits in the event loop, and is
  // delivered only when the loop next polls. Let it reach onLateSignal before the handler goes; removed first, the
  // signal went to whatever other listener was left (signal-exit's, which re-raises it: the finished run then died of
  // SIGINT after saying "done", 3 runs in 7 of review-s37-submit-interrupt under load). Poll comes before check.
  await new Promise((resolve) => setImmediate(resolve));
  lateSignals?.dispose();
  out.write(
    `[submit] ${writeError !== undefined || streamError !== undefined ? 'stopped' : signals.signal !== undefined ? 'interrupted' : 'done'}: ${received} trajectories written this run (${alreadyWritten} before), ` +
      `${submitted} rows submitted, ${skipped} already complete, ${failedRows} rejected or unmappable, ${retryCount} retries` +
      `${refusals > 0 ? ` (and ${refusals} submits refused for now, sent again)` : ''}, ` +
      `${infraRows} rows with infrastructure failures left; reward mean ${mean()} over the ${scored} COMPLETED or TRUNCATED trajectories of this run ` +
      `(other statuses have no reward and are not averaged in); ${statuses()}\n`,
  );
  if (streamError !== undefined) out.write(forTerminal(`[submit] the stream to ${opts.server} failed: ${streamError}`) + '\n');
  if (writeError !== undefined) out.write(`[submit] a write failed (${writeError}): free space and run the same command again to resume (${output.journal} keeps what was written)\n`);
  else if (stopping || streamError !== undefined) out.write(`[submit] run the same command again to resume (${output.journal} keeps what arrived)\n`);
  if (isParquetOutput(outputPath) && !(complete && writeError === undefined)) {
    // The Parquet file is written only once every row is in: say so, or a trainer reads an earlier run's file (or
    // looks for one that is not there) while this run's trajectories wait in the journal.
    const why = failedRows > 0 && !stopping && streamError === undefined ? `${failedRows} rows were rejected or could not be read: fix them and run again` : 'the run did not finish';
    const earlier = existsSync(outputPath) ? `; ${outputPath} is an earlier run's and lacks them` : '';
    out.write(`[submit] ${outputPath} not written (${why}): the trajectories are in ${output.journal}${earlier}\n`);
  }
  if (writeError !== undefined) return EXIT_INFRASTRUCTURE;
  return signals.exitCode !== undefined ? signals.exitCode : streamError !== undefined || infraRows > 0 ? EXIT_INFRASTRUCTURE : failedRows > 0 ? 1 : 0;
}

/** A dataset row as submitted: every attempt of it sends the same instance and metadata. */
interface RowContext extends MappedRow {
  index: number;
  /** Its JSONL line (DatasetRow.line). */
  line?: number;
  rowTaskId: string;
}

/** `FILE:LINE: ` of a JSONL row, for a report on it: its index counts rows, not lines (blank lines are not rows). */
function at(opts: SubmitOptions, line: number | undefined): string {
  return line === undefined ? '' : `${opts.dataset}:${line}: `;
}

interface Attempt {
  row: RowContext;
  attempt: number;
}

function rowTaskIdFor(opts: SubmitOptions, index: number, mapped: MappedRow): string {
  return taskIdFor(opts.dataset, index, opts.environment, mapped.instance, opts.numSamples, sampling(opts));
}

/**
 * Refuses (failed_precondition: exit 2, before anything is submitted) an output that holds rows of this dataset under
 * other task ids than this run gives them: the dataset was edited (a row changed, rows inserted, removed or reordered)
 * or the run's options (--environment, --num-samples, --instance-field, the sampling flags) differ from the run that
 * started the output. Resumed, such a run would leave the old groups beside the new ones: two groups of one row (read
 * as twice the samples in a pass@k), or groups sampled with other settings in one file, without a word. Reads the
 * dataset once more, only when the output holds rows of it (a resume).
 */
async function refuseChangedRows(opts: SubmitOptions, outputPath: string, rowTaskIds: Iterable<string>): Promise<void> {
  const tag = `${datasetTag(opts.dataset)}-`;
  /** Row index → the row task ids the output holds for it. */
  const held = new Map<number, Set<string>>();
  for (const id of rowTaskIds) {
    const m = id.startsWith(tag) ? /^(\d+)-/.exec(id.slice(tag.length)) : null;
    if (m === null) continue; // another dataset's rows: not this run's to judge
    const index = Number(m[1]);
    held.set(index, (held.get(index) ?? new Set<string>()).add(id));
  }
  if (held.size === 0) return;
  const changed: string[] = [];
  let rows = 0;
  for await (const row of readDataset(opts.dataset)) {
    rows = row.index + 1;
    const ids = held.get(row.index);
    if (ids === undefined || 'problem' in row) continue; // a bad row is reported by the run itself
    let id: string;
    try {
      id = rowTaskIdFor(opts, row.index, mapRow(row, opts.environment, opts.instanceField));
    } catch {
      continue; // an unmappable row likewise
    }
    const other = [...ids].find((i) => i !== id);
    if (other !== undefined) changed.push(`row ${row.index} (the output has ${other}, this run makes it ${id})`);
  }
  for (const [index, ids] of held) if (index >= rows) changed.push(`row ${index} (the output has ${[...ids][0]}; the dataset has ${rows} rows)`);
  if (changed.length === 0) return;
  const shown = changed.length <= 3 ? changed.join('; ') : `${changed.slice(0, 3).join('; ')}; and ${changed.length - 3} more rows`;
  throw new RolloutError(
    'failed_precondition',
    `--output ${outputPath}: holds rows of ${opts.dataset} that this run would submit differently: ${shown}. The dataset or the options ` +
      '(--environment, --num-samples, --instance-field, --temperature, --max-tokens-per-turn, --max-total-tokens) changed since the output was started; ' +
      'resuming would mix the two in one file. Run with the options of the first run, or write to a new --output',
  );
}

/** The trajectory with `metadata.attempt` (1 for the row's first): which attempt of its row it came from. */
function stamped(t: Trajectory, attempt: number): Trajectory {
  return { ...t, metadata: { ...t.metadata, attempt: String(attempt) } };
}

/** A refusal by field. The server's reason names its field already ("instance.answer: required"): said once. */
function rejection(err: unknown): string {
  if (!(err instanceof TaskRejectedError)) return (err as Error).message;
  return err.field === '' || err.reason.startsWith(`${err.field}: `) ? err.reason : `${err.field}: ${err.reason}`;
}

function sampling(opts: SubmitOptions): { temperature: number; maxTokensPerTurn: number; maxTotalTokens: number; stop: string[] } | undefined {
  if (opts.temperature === undefined && opts.maxTokensPerTurn === undefined && opts.maxTotalTokens === undefined) return undefined;
  return { temperature: opts.temperature ?? 1, maxTokensPerTurn: opts.maxTokensPerTurn ?? 0, maxTotalTokens: opts.maxTotalTokens ?? 0, stop: [] };
}

function logAbove(bar: cliProgress.SingleBar | undefined, out: NodeJS.WriteStream, line: string): void {
  if (bar) out.write('\r\x1b[2K');
  out.write(`${forTerminal(line)}\n`); // it quotes servers, engines, tools and datasets: shown, never obeyed
}
