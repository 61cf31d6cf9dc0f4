import { connect, connectionOptions, withinConnectTimeout, type ConnectionFlags } from './connection.js';
import cliProgress from 'cli-progress';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { TaskRejectedError } from '../client/rollout-client.js';
import { RolloutError } from '../errors.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { countRows, mapRow, readDataset, taskIdFor } from './submit-dataset.js';
import { openTrajectoryOutput } from './submit-output.js';

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
  /** Where progress goes (default stderr); tests pass a stream. */
  progress?: NodeJS.WriteStream;
}

/** Exit code of a run cut short by the server or the network rather than by the data (2 is a usage mistake). */
const EXIT_INFRASTRUCTURE = 3;

const statusName = (s: TrajectoryStatus): string => TrajectoryStatus[s]?.replace('TRAJECTORY_STATUS_', '') ?? String(s);

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
 * samples already written are not written twice. SIGINT/SIGTERM stop submitting, close the output between two
 * lines and exit 130; re-run to finish.
 *
 * Returns the exit code: 0 when every row's trajectories are in the output, 1 when some rows were rejected (bad
 * instance) or could not be read or mapped (the data: fix those rows), 3 when the server could not be reached or the
 * stream failed (infrastructure: nothing is wrong with the data, re-run to resume), 130 when interrupted.
 */
export async function runSubmit(opts: SubmitOptions): Promise<number> {
  if (!existsSync(opts.dataset)) throw new RolloutError('invalid_argument', `dataset ${opts.dataset} does not exist`);
  if (!Number.isInteger(opts.numSamples) || opts.numSamples < 1) throw new RolloutError('invalid_argument', '--num-samples must be a positive integer');
  if (!Number.isInteger(opts.concurrency) || opts.concurrency < 1) throw new RolloutError('invalid_argument', '--concurrency must be a positive integer');
  const outputPath = opts.output ?? `${opts.dataset.replace(/\.(jsonl|json|parquet|pq)$/i, '')}.trajectories.jsonl`;
  const out = opts.progress ?? process.stderr;
  const total = await countRows(opts.dataset);
  // Flags checked before the output is opened (and locked), so a mistake in them leaves no lock behind.
  const client = connect(opts.server, '--server', connectionOptions(opts));
  const output = await openTrajectoryOutput(outputPath).catch((err: unknown) => {
    client.close();
    throw err;
  });
  const session = client.openSession({ sessionId: `submit-${randomUUID()}` });
  const slots = new Slots(opts.concurrency);

  const counts = new Map<string, number>();
  let rewardSum = 0;
  /** Trajectories that have a reward (COMPLETED, TRUNCATED): infrastructure failures stay out of the mean. */
  let scored = 0;
  let received = 0;
  let skipped = 0;
  let submitted = 0;
  let failedRows = 0;
  let interrupted = false;
  let streamError: string | undefined;
  /** Samples each submitted task still owes; the slot is given back when it reaches 0. */
  const owed = new Map<string, number>();
  const alreadyWritten = [...output.written.values()].reduce((n, s) => n + s.size, 0);

  const bar = out.isTTY
    ? new cliProgress.SingleBar(
        { format: 'trajectories {bar} {value}/{total} | reward {reward} | {statuses}', stream: out, hideCursor: true, etaBuffer: 50 },
        cliProgress.Presets.shades_classic,
      )
    : undefined;
  const statuses = (): string => [...counts].map(([s, n]) => `${s} ${n}`).join(' ') || '-';
  const mean = (): string => (scored === 0 ? '-' : (rewardSum / scored).toFixed(3));
  let lastLine = 0;
  const report = (force = false): void => {
    if (bar) {
      bar.update(alreadyWritten + received, { reward: mean(), statuses: statuses() });
      return;
    }
    if (!force && Date.now() - lastLine < 2000) return;
    lastLine = Date.now();
    out.write(`[submit] ${alreadyWritten + received}/${total * opts.numSamples} trajectories | reward mean ${mean()} | ${statuses()}\n`);
  };

  const onSignal = (): void => {
    interrupted = true;
    slots.release();
    session.abort();
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);

  const receive = (t: Trajectory): void => {
    if (output.write(t)) {
      received++;
      if (t.status === TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED || t.status === TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED) {
        scored++;
        rewardSum += t.reward;
      }
      counts.set(statusName(t.status), (counts.get(statusName(t.status)) ?? 0) + 1);
      report();
    }
    const left = (owed.get(t.taskId) ?? 0) - 1;
    if (left <= 0 && owed.delete(t.taskId)) slots.give();
    else if (left > 0) owed.set(t.taskId, left);
  };

  const receiving = (async () => {
    try {
      for await (const t of session.trajectories()) receive(t);
    } catch (err) {
      if (!interrupted) throw err;
    }
  })();
  // Awaited below; a stream that fails first (no server) fails `opened` too, which is what is reported then.
  receiving.catch(() => undefined);
  bar?.start(total * opts.numSamples, alreadyWritten, { reward: mean(), statuses: statuses() });
  if (!bar) out.write(`[submit] ${opts.dataset}: ${total} rows × ${opts.numSamples} samples → ${outputPath} (server ${opts.server})\n`);
  try {
    await withinConnectTimeout(client.rollout, opts.server, opts, session.opened).catch((err: unknown) => {
      session.abort();
      throw err instanceof RolloutError ? new Error(err.message) : err; // a stream failure, reported as one
    });
    for await (const row of readDataset(opts.dataset)) {
      if (interrupted) break;
      if ('problem' in row) {
        failedRows++;
        logAbove(bar, out, `[submit] row ${row.index} skipped: ${row.problem}`);
        continue;
      }
      let taskId: string;
      let mapped: ReturnType<typeof mapRow>;
      try {
        mapped = mapRow(row, opts.environment, opts.instanceField);
        taskId = taskIdFor(opts.dataset, row.index, opts.environment, mapped.instance, opts.numSamples);
      } catch (err) {
        failedRows++;
        logAbove(bar, out, `[submit] row ${row.index} skipped: ${(err as Error).message}`);
        continue;
      }
      if ((output.written.get(taskId)?.size ?? 0) >= opts.numSamples) {
        skipped++;
        continue;
      }
      await slots.take();
      if (interrupted) break;
      owed.set(taskId, opts.numSamples);
      submitted++;
      session
        .submit({
          taskId,
          groupId: taskId,
          environment: opts.environment,
          numSamples: opts.numSamples,
          instance: mapped.instance,
          metadata: mapped.metadata,
          ...(sampling(opts) && { sampling: sampling(opts) }),
        })
        .catch((err: unknown) => {
          if (owed.delete(taskId)) slots.give();
          if (interrupted) return;
          failedRows++;
          const why = err instanceof TaskRejectedError ? `${err.field}: ${err.reason}` : (err as Error).message;
          logAbove(bar, out, `[submit] row ${row.index} (${taskId}) rejected: ${why}`);
        });
    }
    session.close();
    await receiving;
  } catch (err) {
    // The server went away or refused the stream: what arrived is in the output; a re-run resumes.
    if (err instanceof RolloutError) throw err;
    streamError = (err as Error).message;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    report(true);
    bar?.stop();
    client.close();
  }
  const complete = !interrupted && failedRows === 0 && streamError === undefined;
  await output.close(complete);
  out.write(
    `[submit] ${interrupted ? 'interrupted' : 'done'}: ${received} trajectories written this run (${alreadyWritten} before), ` +
      `${submitted} rows submitted, ${skipped} already complete, ${failedRows} rejected or unmappable; reward mean ${mean()}; ${statuses()}\n`,
  );
  if (streamError !== undefined) out.write(`[submit] the stream to ${opts.server} failed: ${streamError}\n`);
  if (interrupted || streamError !== undefined) out.write(`[submit] run the same command again to resume (${output.journal} keeps what arrived)\n`);
  return interrupted ? 130 : streamError !== undefined ? EXIT_INFRASTRUCTURE : failedRows > 0 ? 1 : 0;
}

function sampling(opts: SubmitOptions): { temperature: number; maxTokensPerTurn: number; maxTotalTokens: number; stop: string[] } | undefined {
  if (opts.temperature === undefined && opts.maxTokensPerTurn === undefined && opts.maxTotalTokens === undefined) return undefined;
  return { temperature: opts.temperature ?? 1, maxTokensPerTurn: opts.maxTokensPerTurn ?? 0, maxTotalTokens: opts.maxTotalTokens ?? 0, stop: [] };
}

function logAbove(bar: cliProgress.SingleBar | undefined, out: NodeJS.WriteStream, line: string): void {
  if (bar) out.write('\r\x1b[2K');
  out.write(`${line}\n`);
}
