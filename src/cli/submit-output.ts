import { closeSync, existsSync, fstatSync, openSync, readFileSync, readSync, renameSync, rmSync, writeFileSync, writeSync, ftruncateSync } from 'node:fs';
import { parquetWriteBuffer } from 'hyparquet-writer';
import { asyncBufferFromFile, parquetReadObjects } from 'hyparquet';
import { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { RolloutError } from '../errors.js';
import { isProcessAlive } from '../sandboxes/images/process-identity.js';

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
 * policy_version_min/max, and as JSON strings reward_details, eval_report, turns, messages, timing, metadata.
 */
export interface TrajectoryOutput {
  /** Where lines go (the output itself, or the Parquet journal). */
  readonly journal: string;
  /** Samples already written, by task id (loaded from the file at open). */
  readonly written: ReadonlyMap<string, ReadonlySet<number>>;
  /** Appends one trajectory; false (and nothing written) when that task/sample is already there. */
  write(trajectory: Trajectory): boolean;
  /** Closes the file; with `complete`, a Parquet output is written from the journal. */
  close(complete: boolean): Promise<void>;
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
  let fd: number;
  try {
    fd = openSync(journal, existsSync(journal) ? 'r+' : 'w+');
  } catch (err) {
    throw new RolloutError('invalid_argument', `--output ${journal}: cannot open: ${(err as Error).message}`, { cause: err });
  }
  let end: number;
  let unlock: () => void = () => undefined;
  try {
    unlock = takeLock(journal);
    end = scanJournal(fd, written);
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
    write(trajectory: Trajectory): boolean {
      const samples = written.get(trajectory.taskId) ?? new Set<number>();
      if (samples.has(trajectory.sampleIndex)) return false;
      const line = Buffer.from(JSON.stringify(Trajectory.toJSON(trajectory)) + '\n');
      let done = 0;
      while (done < line.length) done += writeSync(fd, line, done, line.length - done, end + done);
      end += line.length;
      samples.add(trajectory.sampleIndex);
      written.set(trajectory.taskId, samples);
      return true;
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
 * newline whose line parses. A torn tail (no newline, or not JSON) is dropped.
 */
function scanJournal(fd: number, written: Map<string, Set<number>>): number {
  const size = fstatSync(fd).size;
  const buffer = Buffer.alloc(size);
  let read = 0;
  while (read < size) read += readSync(fd, buffer, read, size - read, read);
  let keep = 0;
  let start = 0;
  for (let nl = buffer.indexOf(10, start); nl !== -1; nl = buffer.indexOf(10, start)) {
    const line = buffer.subarray(start, nl).toString('utf8');
    start = nl + 1;
    if (line.trim() === '') {
      keep = start;
      continue;
    }
    let record: { taskId?: unknown; sampleIndex?: unknown };
    try {
      record = JSON.parse(line) as typeof record;
    } catch {
      break; // a torn line in the middle can only be the tail of an earlier crash: keep what precedes it
    }
    if (typeof record.taskId !== 'string') break;
    const index = typeof record.sampleIndex === 'number' ? record.sampleIndex : 0;
    const samples = written.get(record.taskId) ?? new Set<number>();
    samples.add(index);
    written.set(record.taskId, samples);
    keep = start;
  }
  return keep;
}

async function seedJournalFromParquet(path: string, journal: string): Promise<void> {
  let rows: Record<string, unknown>[];
  try {
    rows = await parquetReadObjects({ file: await asyncBufferFromFile(path) });
  } catch (err) {
    throw new RolloutError('invalid_argument', `output ${path} exists and is not a Parquet file: ${(err as Error).message}`);
  }
  const json = (v: unknown): unknown => (typeof v === 'string' && v !== '' ? JSON.parse(v) : undefined);
  const lines = rows.map((r) =>
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
      rewardDetails: json(r.reward_details),
      evalReport: json(r.eval_report),
      turns: json(r.turns),
      messages: json(r.messages),
      timing: json(r.timing),
      metadata: json(r.metadata),
    }),
  );
  writeFileSync(journal, lines.map((l) => l + '\n').join(''));
}

const STRING = { type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' } as const;
const listOf = (name: string, type: 'INT32' | 'DOUBLE') => [
  { name, repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  { name: 'element', type, repetition_type: 'OPTIONAL' },
] as const;

/** Writes the Parquet file from the journal (atomically: a temp file renamed over the target). */
function writeParquet(journal: string, path: string): void {
  const trajectories = readFileSync(journal, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => Trajectory.fromJSON(JSON.parse(l)));
  const col = <T>(f: (t: Trajectory) => T): T[] => trajectories.map(f);
  const asJson = trajectories.map((t) => Trajectory.toJSON(t) as { status?: string; turns?: unknown });
  const json = (v: unknown): string => JSON.stringify(v ?? null);
  const strings = ['task_id', 'group_id', 'environment', 'status', 'finish_reason', 'error'];
  const schema = [
    { name: 'root', num_children: 21 },
    ...strings.slice(0, 1).map((name) => ({ name, ...STRING })),
    { name: 'sample_index', type: 'INT32', repetition_type: 'OPTIONAL' },
    ...strings.slice(1).map((name) => ({ name, ...STRING })),
    { name: 'reward', type: 'DOUBLE', repetition_type: 'OPTIONAL' },
    { name: 'num_turns', type: 'INT32', repetition_type: 'OPTIONAL' },
    ...listOf('prompt_token_ids', 'INT32'),
    ...listOf('response_token_ids', 'INT32'),
    ...listOf('response_mask', 'INT32'),
    ...listOf('response_logprobs', 'DOUBLE'),
    { name: 'policy_version_min', type: 'INT64', repetition_type: 'OPTIONAL' },
    { name: 'policy_version_max', type: 'INT64', repetition_type: 'OPTIONAL' },
    ...['reward_details', 'eval_report', 'turns', 'messages', 'timing', 'metadata'].map((name) => ({ name, ...STRING })),
  ];
  const buffer = parquetWriteBuffer({
    schema: schema as Parameters<typeof parquetWriteBuffer>[0]['schema'],
    columnData: [
      { name: 'task_id', data: col((t) => t.taskId) },
      { name: 'sample_index', data: col((t) => t.sampleIndex) },
      { name: 'group_id', data: col((t) => t.groupId) },
      { name: 'environment', data: col((t) => t.environment) },
      { name: 'status', data: asJson.map((j) => j.status ?? 'TRAJECTORY_STATUS_UNSPECIFIED') },
      { name: 'finish_reason', data: col((t) => t.finishReason) },
      { name: 'error', data: col((t) => t.error) },
      { name: 'reward', data: col((t) => t.reward) },
      { name: 'num_turns', data: col((t) => t.numTurns) },
      { name: 'prompt_token_ids', data: col((t) => t.promptTokenIds) },
      { name: 'response_token_ids', data: col((t) => t.responseTokenIds) },
      { name: 'response_mask', data: col((t) => t.responseMask) },
      { name: 'response_logprobs', data: col((t) => t.responseLogprobs) },
      { name: 'policy_version_min', data: col((t) => BigInt(t.policyVersionMin)) },
      { name: 'policy_version_max', data: col((t) => BigInt(t.policyVersionMax)) },
      { name: 'reward_details', data: col((t) => json(t.rewardDetails)) },
      { name: 'eval_report', data: col((t) => json(t.evalReport)) },
      { name: 'turns', data: asJson.map((j) => json(j.turns ?? [])) },
      { name: 'messages', data: col((t) => json(t.messages)) },
      { name: 'timing', data: col((t) => json(t.timing)) },
      { name: 'metadata', data: col((t) => json(t.metadata)) },
    ],
  });
  const temp = `${path}.tmp-${process.pid}`;
  writeFileSync(temp, new Uint8Array(buffer));
  renameSync(temp, path);
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
