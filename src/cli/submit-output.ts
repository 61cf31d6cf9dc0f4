import { closeSync, existsSync, fstatSync, fsyncSync, openSync, readdirSync, readFileSync, readSync, renameSync, rmSync, writeFileSync, writeSync, ftruncateSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { fileWriter, ParquetWriter } from 'hyparquet-writer';
import { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects } from 'hyparquet';
import { logprobsModeToJSON } from '../../gen/ts/rollout/v1/backend.js';
import { Trajectory, TrajectoryStatus, trajectoryStatusToJSON, Turn } from '../../gen/ts/rollout/v1/rollout.js';
import { RolloutError } from '../errors.js';
import { isProcessAlive } from '../sandboxes/images/process-identity.js';
import { isRetryableStatus, isRetryableStatusName } from './submit-attempts.js';

/**
 * Where `rollout submit` writes trajectories, as they arrive, so that an interrupted run can resume.
 *
 * JSONL (default): one trajectory a line, in the protobuf JSON mapping (`Trajectory.toJSON`: camelCase, status by
 * name, fields at their default value left out), appended with one write per line. Ctrl-C cannot tear a line (a
 * line is one synchronous write); a SIGKILL or a crash can, and the next run cuts the torn tail off before it
 * appends (it is not counted as written, so that sample is fetched again).
 *
 * Parquet (a path ending in .parquet): a Parquet file cannot be appended to (its index is a footer), so lines go to
 * the journal `<output>.partial.jsonl` exactly as above, and the Parquet file is written from it once every
 * instance is in, then the journal is removed. An interrupted run leaves the journal; the next run resumes from it.
 * Columns: task_id, sample_index, group_id, environment, status, finish_reason, error, reward, num_turns,
 * prompt_token_ids, response_token_ids, response_mask (lists of int32), response_logprobs (list of double),
 * policy_version_min/max, and as JSON strings reward_details, eval_report, turns, messages, timing, metadata; then
 * logprobs_mode (by name), stale, staleness_restarts. `reward` is null for a status that has no reward ({@link hasReward}).
 */
export interface TrajectoryOutput {
  /** Where lines go (the output itself, or the Parquet journal). */
  readonly journal: string;
  /** Samples already written, by task id (loaded from the file at open). */
  readonly written: ReadonlyMap<string, ReadonlySet<number>>;
  /** Task ids with a sample whose status is an infrastructure failure (submit-attempts.ts: what a retry may mend). */
  readonly failed: ReadonlySet<string>;
  /** Appends one trajectory; false (and nothing written) when that task/sample is already there. */
  write(trajectory: Trajectory): boolean;
  /**
   * Moves every line of the tasks `ids` out of the journal, each handed to `into` (streamed: the journal is copied
   * line by line to a temporary file renamed over it), so a later attempt's group is the only one of its row left.
   */
  remove(ids: ReadonlySet<string>, into: (trajectory: Trajectory) => void): void;
  /** Closes the file; with `complete`, a Parquet output is written from the journal. */
  close(complete: boolean): Promise<void>;
  /** Bytes cut off the end at open: a torn last line a run killed mid-write left (0 when none). */
  readonly tornBytes: number;
}

/**
 * Whether the trajectory's reward means anything: a policy outcome (COMPLETED, TRUNCATED). Any other status (an
 * infrastructure failure, INVALID_TASK) has no reward: it is written as none (JSONL: no `reward`; Parquet: null), never
 * as 0, which would read as a wrong answer in a pass rate.
 */
export function hasReward(status: TrajectoryStatus): boolean {
  return status === TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED || status === TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED;
}

/**
 * A journal line: `Trajectory.toJSON`, but the reward is always there for a policy outcome (toJSON leaves a 0 out, so a
 * wrong answer would read as "no reward" and drop out of a mean that skips missing values) and never for anything else.
 */
function trajectoryJson(trajectory: Trajectory): unknown {
  const json = Trajectory.toJSON(trajectory) as Record<string, unknown>;
  if (hasReward(trajectory.status)) json.reward = trajectory.reward;
  else delete json.reward;
  return json;
}

export function isParquetOutput(path: string): boolean {
  return /\.(parquet|pq)$/i.test(path);
}

/**
 * Opens (or creates) `path` for appending, dropping a torn last line; reads which samples it already holds. Holds
 * `<journal>.lock` until closed: a second run on the same output is refused while this one is alive.
 */
export async function openTrajectoryOutput(path: string): Promise<TrajectoryOutput> {
  const parquet = isParquetOutput(path);
  const journal = parquet ? `${path}.partial.jsonl` : path;
  if (parquet && !existsSync(journal) && existsSync(path)) await seedJournalFromParquet(path, journal);
  const written = new Map<string, Set<number>>();
  const failed = new Set<string>();
  let fd: number;
  try {
    fd = openSync(journal, existsSync(journal) ? 'r+' : 'w+');
  } catch (err) {
    throw new RolloutError('invalid_argument', `--output ${journal}: cannot open: ${(err as Error).message}`, { cause: err });
  }
  let end: number;
  let tornBytes = 0;
  let unlock: () => void = () => undefined;
  try {
    unlock = takeLock(journal);
    removeDeadTemps(parquet ? [journal, path] : [journal]);
    end = scanJournal(fd, written, failed, journal);
    tornBytes = fstatSync(fd).size - end;
    ftruncateSync(fd, end);
  } catch (err) {
    closeSync(fd);
    unlock();
    throw err;
  }
  let closed = false;
  return {
    journal,
    written,
    tornBytes,
    failed,
    write(trajectory: Trajectory): boolean {
      const samples = written.get(trajectory.taskId) ?? new Set<number>();
      if (samples.has(trajectory.sampleIndex)) return false;
      const line = Buffer.from(JSON.stringify(trajectoryJson(trajectory)) + '\n');
      let done = 0;
      try {
        while (done < line.length) done += writeSync(fd, line, done, line.length - done, end + done);
      } catch (err) {
        // A full disk (ENOSPC) or a size limit: the part of the line written is cut off again (best effort: a re-run
        // drops a torn tail anyway), and the caller stops the run: a line that is not written is not a sample kept.
        try {
          ftruncateSync(fd, end);
        } catch {
          // the torn tail stays; the next open cuts it off
        }
        throw new Error(`cannot write ${journal}: ${(err as Error).message}`, { cause: err });
      }
      end += line.length;
      samples.add(trajectory.sampleIndex);
      written.set(trajectory.taskId, samples);
      if (isRetryableStatus(trajectory.status)) failed.add(trajectory.taskId);
      return true;
    },
    remove(ids: ReadonlySet<string>, into: (trajectory: Trajectory) => void): void {
      if (![...ids].some((id) => written.has(id))) return;
      const temp = `${journal}.tmp-${process.pid}`;
      const out = openSync(temp, 'w');
      let kept = 0;
      let moved = false;
      try {
        for (const { line } of journalLines(fd)) {
          const record = JSON.parse(line.toString('utf8')) as { taskId?: unknown };
          if (typeof record.taskId === 'string' && ids.has(record.taskId)) {
            into(Trajectory.fromJSON(record));
            continue;
          }
          const bytes = Buffer.concat([line, NEWLINE]);
          try {
            for (let done = 0; done < bytes.length; ) done += writeSync(out, bytes, done, bytes.length - done, kept + done);
          } catch (err) {
            throw new Error(`cannot write ${temp}: ${(err as Error).message}`, { cause: err });
          }
          kept += bytes.length;
        }
        fsyncSync(out); // renamed over the journal below: what a power loss keeps of it is then the whole copy
        moved = true;
      } finally {
        closeSync(out);
        // A failed copy (a full disk) leaves the journal as it was; the next run moves those lines again.
        if (!moved) rmSync(temp, { force: true });
      }
      // The lines moved are already in `into`'s file: a crash before this rename leaves them in both, and the next
      // run moves them again (`into` skips a sample it holds).
      renameSync(temp, journal);
      syncDirectory(journal);
      closeSync(fd);
      fd = openSync(journal, 'r+');
      end = kept;
      for (const id of ids) {
        written.delete(id);
        failed.delete(id);
      }
    },
    async close(complete: boolean): Promise<void> {
      if (closed) return;
      closed = true;
      closeSync(fd);
      try {
        if (parquet && complete) {
          writeParquet(journal, path);
          rmSync(journal, { force: true });
        }
      } finally {
        unlock();
      }
    },
  };
}

/**
 * Reads the journal's complete lines into `written` and returns the byte length to keep: everything up to the last
 * newline whose line parses. A torn tail (no newline, or lines that are not trajectories up to the end: a crash
 * mid-write, a power loss's zeros) is dropped. A line that is not a trajectory with trajectories after it is not a
 * crash's tail but a damaged or edited file: cutting there would drop every sample after it without a word, so the
 * output is refused, naming the line.
 */
function scanJournal(fd: number, written: Map<string, Set<number>>, failed: Set<string>, journal: string): number {
  let keep = 0;
  let lineNumber = 0;
  let bad: { line: number; why: string } | undefined;
  for (const { line: bytes, end } of journalLines(fd)) {
    lineNumber++;
    const line = bytes.toString('utf8');
    if (line.trim() === '') {
      if (bad === undefined) keep = end;
      continue;
    }
    let record: { taskId?: unknown; sampleIndex?: unknown; status?: unknown };
    try {
      record = JSON.parse(line) as typeof record;
    } catch {
      bad ??= { line: lineNumber, why: 'not JSON' };
      continue;
    }
    if (typeof record !== 'object' || record === null || typeof record.taskId !== 'string') {
      bad ??= { line: lineNumber, why: 'no taskId' };
      continue;
    }
    if (bad !== undefined) {
      throw new RolloutError(
        'failed_precondition',
        `--output ${journal}: line ${bad.line} is not a trajectory (${bad.why}) and trajectories follow it (line ${lineNumber}): not a torn tail, so nothing is cut off; remove or repair line ${bad.line} and run again`,
      );
    }
    const index = typeof record.sampleIndex === 'number' ? record.sampleIndex : 0;
    const samples = written.get(record.taskId) ?? new Set<number>();
    samples.add(index);
    written.set(record.taskId, samples);
    if (isRetryableStatusName(typeof record.status === 'string' ? record.status : 'TRAJECTORY_STATUS_UNSPECIFIED')) failed.add(record.taskId);
    keep = end;
  }
  return keep;
}

const NEWLINE = Buffer.from('\n');
const READ_CHUNK = 1 << 20;

/**
 * The journal's complete lines (without their newline) and the offset just past each, read a chunk at a time: memory
 * is bounded by the longest line, not the journal (a million-row output is gigabytes). A tail with no newline is not
 * yielded.
 */
export function* journalLines(fd: number): Generator<{ line: Buffer; end: number }> {
  const size = fstatSync(fd).size;
  let carry = Buffer.alloc(0);
  let carryStart = 0;
  const chunk = Buffer.alloc(READ_CHUNK);
  for (let position = 0; position < size; ) {
    const n = readSync(fd, chunk, 0, Math.min(READ_CHUNK, size - position), position);
    if (n === 0) break;
    position += n;
    const data = carry.length === 0 ? chunk.subarray(0, n) : Buffer.concat([carry, chunk.subarray(0, n)]);
    let start = 0;
    for (let nl = data.indexOf(10, start); nl !== -1; nl = data.indexOf(10, start)) {
      yield { line: data.subarray(start, nl), end: carryStart + nl + 1 };
      start = nl + 1;
    }
    // Copied: `chunk` is reused by the next read.
    carry = Buffer.from(data.subarray(start));
    carryStart += start;
  }
}

/** Rows read back at a time when a Parquet output is turned into its journal again (a re-run on a finished output). */
const SEED_CHUNK_ROWS = 256;

async function seedJournalFromParquet(path: string, journal: string): Promise<void> {
  const notParquet = (err: unknown): RolloutError => new RolloutError('invalid_argument', `output ${path} exists and is not a Parquet file: ${(err as Error).message}`);
  let file: Awaited<ReturnType<typeof asyncBufferFromFile>>;
  let total: number;
  try {
    file = await asyncBufferFromFile(path);
    total = Number((await parquetMetadataAsync(file)).num_rows);
  } catch (err) {
    throw notParquet(err);
  }
  const json = (v: unknown): unknown => (typeof v === 'string' && v !== '' ? JSON.parse(v) : undefined);
  const toLine = (r: Record<string, unknown>): string =>
    JSON.stringify({
      taskId: r.task_id,
      sampleIndex: r.sample_index,
      groupId: r.group_id,
      environment: r.environment,
      status: r.status,
      finishReason: r.finish_reason,
      error: r.error,
      reward: r.reward,
      numTurns: r.num_turns,
      promptTokenIds: r.prompt_token_ids,
      responseTokenIds: r.response_token_ids,
      responseMask: r.response_mask,
      responseLogprobs: r.response_logprobs,
      policyVersionMin: Number(r.policy_version_min),
      policyVersionMax: Number(r.policy_version_max),
      logprobsMode: r.logprobs_mode ?? undefined,
      stale: r.stale ?? undefined,
      stalenessRestarts: r.staleness_restarts ?? undefined,
      rewardDetails: json(r.reward_details),
      evalReport: json(r.eval_report),
      turns: json(r.turns),
      messages: json(r.messages),
      timing: json(r.timing),
      metadata: json(r.metadata),
    });
  // A row group's worth at a time: a million-row output is not held in memory to be turned back into its journal.
  const temp = `${journal}.tmp-${process.pid}`;
  const fd = openSync(temp, 'w');
  try {
    for (let start = 0; start < total; start += SEED_CHUNK_ROWS) {
      let rows: Record<string, unknown>[];
      try {
        rows = await parquetReadObjects({ file, rowStart: start, rowEnd: Math.min(total, start + SEED_CHUNK_ROWS) });
      } catch (err) {
        throw notParquet(err);
      }
      const bytes = Buffer.from(rows.map((r) => toLine(r) + '\n').join(''));
      for (let done = 0; done < bytes.length; ) done += writeSync(fd, bytes, done, bytes.length - done);
    }
    fsyncSync(fd);
  } catch (err) {
    closeSync(fd);
    rmSync(temp, { force: true });
    throw err;
  }
  closeSync(fd);
  renameSync(temp, journal); // whole or not at all: a journal cut short would read as a run that lost rows
  syncDirectory(journal);
}

const STRING = { type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' } as const;
const listOf = (name: string, type: 'INT32' | 'DOUBLE') => [
  { name, repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  { name: 'element', type, repetition_type: 'OPTIONAL' },
] as const;

/** Rows a row group holds at most, and the JSON bytes after which one is written sooner (long trajectories). */
const ROW_GROUP_ROWS = 4096;
const ROW_GROUP_JSON_BYTES = 4 << 20;

const PARQUET_SCHEMA = [
  { name: 'root', num_children: 24 },
  { name: 'task_id', ...STRING },
  { name: 'sample_index', type: 'INT32', repetition_type: 'OPTIONAL' },
  ...['group_id', 'environment', 'status', 'finish_reason', 'error'].map((name) => ({ name, ...STRING })),
  { name: 'reward', type: 'DOUBLE', repetition_type: 'OPTIONAL' },
  { name: 'num_turns', type: 'INT32', repetition_type: 'OPTIONAL' },
  ...listOf('prompt_token_ids', 'INT32'),
  ...listOf('response_token_ids', 'INT32'),
  ...listOf('response_mask', 'INT32'),
  ...listOf('response_logprobs', 'DOUBLE'),
  { name: 'policy_version_min', type: 'INT64', repetition_type: 'OPTIONAL' },
  { name: 'policy_version_max', type: 'INT64', repetition_type: 'OPTIONAL' },
  ...['reward_details', 'eval_report', 'turns', 'messages', 'timing', 'metadata', 'logprobs_mode'].map((name) => ({ name, ...STRING })),
  { name: 'stale', type: 'BOOLEAN', repetition_type: 'OPTIONAL' },
  { name: 'staleness_restarts', type: 'INT32', repetition_type: 'OPTIONAL' },
];

/** The columns of one row group. */
function columnData(trajectories: Trajectory[]): Array<{ name: string; data: unknown[] }> {
  const col = <T>(f: (t: Trajectory) => T): T[] => trajectories.map(f);
  const json = (v: unknown): string => JSON.stringify(v ?? null);
  // Not Trajectory.toJSON: it would copy every token array of the row group once more.
  return [
    { name: 'task_id', data: col((t) => t.taskId) },
    { name: 'sample_index', data: col((t) => t.sampleIndex) },
    { name: 'group_id', data: col((t) => t.groupId) },
    { name: 'environment', data: col((t) => t.environment) },
    { name: 'status', data: col((t) => trajectoryStatusToJSON(t.status)) },
    { name: 'finish_reason', data: col((t) => t.finishReason) },
    { name: 'error', data: col((t) => t.error) },
    { name: 'reward', data: col((t) => (hasReward(t.status) ? t.reward : null)) },
    { name: 'num_turns', data: col((t) => t.numTurns) },
    { name: 'prompt_token_ids', data: col((t) => t.promptTokenIds) },
    { name: 'response_token_ids', data: col((t) => t.responseTokenIds) },
    { name: 'response_mask', data: col((t) => t.responseMask) },
    { name: 'response_logprobs', data: col((t) => t.responseLogprobs) },
    { name: 'policy_version_min', data: col((t) => BigInt(t.policyVersionMin)) },
    { name: 'policy_version_max', data: col((t) => BigInt(t.policyVersionMax)) },
    { name: 'reward_details', data: col((t) => json(t.rewardDetails)) },
    { name: 'eval_report', data: col((t) => json(t.evalReport)) },
    { name: 'turns', data: col((t) => json(t.turns.map((turn) => Turn.toJSON(turn)))) },
    { name: 'messages', data: col((t) => json(t.messages)) },
    { name: 'timing', data: col((t) => json(t.timing)) },
    { name: 'metadata', data: col((t) => json(t.metadata)) },
    { name: 'logprobs_mode', data: col((t) => logprobsModeToJSON(t.logprobsMode)) },
    { name: 'stale', data: col((t) => t.stale) },
    { name: 'staleness_restarts', data: col((t) => t.stalenessRestarts) },
  ];
}

/**
 * Writes the Parquet file from the journal (atomically: a temp file renamed over the target), streamed: the journal
 * is read a line at a time and written a row group at a time (at most ROW_GROUP_ROWS rows or ~ROW_GROUP_JSON_BYTES of
 * JSON), so memory is bounded by one row group, not the output (a million-row run's journal is gigabytes).
 */
function writeParquet(journal: string, path: string): void {
  const temp = `${path}.tmp-${process.pid}`;
  const fd = openSync(journal, 'r');
  try {
    const writer = new ParquetWriter({ writer: fileWriter(temp), schema: PARQUET_SCHEMA as ConstructorParameters<typeof ParquetWriter>[0]['schema'] });
    let group: Trajectory[] = [];
    let bytes = 0;
    const flush = (): void => {
      if (group.length === 0) return;
      void writer.write({ columnData: columnData(group) as Parameters<typeof writer.write>[0]['columnData'], rowGroupSize: group.length });
      group = [];
      bytes = 0;
    };
    for (const { line } of journalLines(fd)) {
      const text = line.toString('utf8');
      if (text.trim() === '') continue;
      group.push(Trajectory.fromJSON(JSON.parse(text)));
      bytes += line.length;
      if (group.length >= ROW_GROUP_ROWS || bytes >= ROW_GROUP_JSON_BYTES) flush();
    }
    flush();
    void writer.finish(); // the file writer's finish is synchronous (its last flush)
    syncFile(temp);
  } catch (err) {
    rmSync(temp, { force: true });
    throw err;
  } finally {
    closeSync(fd);
  }
  renameSync(temp, path);
  // Before the caller removes the journal: a power loss must leave the journal or the whole Parquet file, not neither.
  syncDirectory(path);
}

/**
 * fsyncs a file written by others (hyparquet-writer appends with writeFileSync). Without it a rename can reach the disk
 * before the data it names: after a power loss the output would be there, empty or cut short (ext4 without
 * auto_da_alloc, XFS).
 */
function syncFile(path: string): void {
  const fd = openSync(path, 'r');
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** fsyncs the directory holding `path`, so a rename into it is on disk before anything relies on it. */
function syncDirectory(path: string): void {
  syncFile(dirname(path));
}

/**
 * Removes the temporary files (`<file>.tmp-<pid>`: a journal being rewritten, a Parquet file being written) that a run
 * killed mid-write (SIGKILL, the OOM killer, a lost node) left beside `files`: nothing else removes them, and a
 * Parquet one is as large as the output. Only those of a process that is gone: the caller holds the output's lock, but
 * a run opening the output seeds its journal before taking it.
 */
function removeDeadTemps(files: string[]): void {
  for (const file of files) {
    const prefix = `${basename(file)}.tmp-`;
    let names: string[];
    try {
      names = readdirSync(dirname(file));
    } catch {
      continue; // an unreadable directory: nothing to clean, the open says what is wrong with it
    }
    for (const name of names) {
      if (!name.startsWith(prefix)) continue;
      const pid = Number(name.slice(prefix.length));
      if (!Number.isInteger(pid) || pid <= 0 || String(pid) !== name.slice(prefix.length)) continue;
      if (pid === process.pid || isProcessAlive(pid)) continue;
      rmSync(join(dirname(file), name), { force: true });
    }
  }
}

/**
 * Takes `<journal>.lock` for this process (its pid inside), so two runs cannot append to one output at once: each
 * writes at the offset it read at open, so the second would overwrite the first's lines. A lock whose process is gone
 * (SIGKILL, a crash) is taken over; one held by a live process is failed_precondition naming its pid.
 */
function takeLock(journal: string): () => void {
  const lock = `${journal}.lock`;
  for (let attempt = 0; ; attempt++) {
    try {
      writeFileSync(lock, String(process.pid), { flag: 'wx' });
      return () => rmSync(lock, { force: true });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST' || attempt > 0) {
        throw new RolloutError('invalid_argument', `--output ${journal}: cannot take ${lock}: ${(err as Error).message}`, { cause: err });
      }
    }
    const holder = Number.parseInt(readFileSync(lock, 'utf8'), 10);
    if (Number.isInteger(holder) && holder > 0 && holder !== process.pid && isProcessAlive(holder)) {
      throw new RolloutError('failed_precondition', `--output ${journal}: another rollout submit (pid ${holder}) is writing it; wait for it or stop it`);
    }
    rmSync(lock, { force: true }); // stale: its process is gone
  }
}
