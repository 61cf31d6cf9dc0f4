import { createHash } from 'node:crypto';
import { createReadStream, realpathSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects } from 'hyparquet';
import { canonicalJson } from '../pipeline/canonical-json.js';
import { RolloutError } from '../errors.js';

/**
 * Dataset rows for `rollout submit --dataset`: JSONL (one JSON object a line) or Parquet (read with hyparquet, a row
 * group at a time), each mapped to an environment instance and given a task id that is the same on every run.
 *
 * verl's layout (its data preprocessing scripts write Parquet with these columns) is recognised and mapped:
 *
 *   data_source   string                 → TaskSpec.metadata.data_source
 *   prompt        [{role, content}, ...] → math: `problem` is the content of the last user message
 *   ability       string                 → TaskSpec.metadata.ability
 *   reward_model  {ground_truth, style}  → math: `answer` is ground_truth
 *   extra_info    {index, split, ...}    → TaskSpec.metadata.extra_info (JSON)
 *
 * For another environment a verl row is passed whole as the instance (its environment reads the columns it knows).
 * A plain row is the instance itself, or its field `--instance-field NAME` (an object, or a JSON string) when given.
 */

/** One row, numbered from 0 in file order (blank JSONL lines are not rows). */
export interface DatasetRow {
  index: number;
  row: Record<string, unknown>;
  /** The JSONL line it is on (from 1), for reports; none for a Parquet row (its index is its place). */
  line?: number;
}

/**
 * A JSONL line that is not a row (not JSON, or not an object): `problem` names the file and line. It keeps its index,
 * so the rows after it keep theirs (and their task ids) once it is fixed.
 */
export interface BadRow {
  index: number;
  problem: string;
}

export type DatasetFormat = 'jsonl' | 'parquet';

/** The format by file name: .parquet (or .pq) is Parquet, anything else JSON lines. */
export function datasetFormat(path: string): DatasetFormat {
  return /\.(parquet|pq)$/i.test(path) ? 'parquet' : 'jsonl';
}

const PARQUET_CHUNK_ROWS = 512;

/** Rows in the dataset (Parquet: from its footer; JSONL: one pass counting non-blank lines). */
export async function countRows(path: string): Promise<number> {
  if (datasetFormat(path) === 'parquet') return Number((await unreadable(path, async () => parquetMetadataAsync(await openParquet(path)))).num_rows);
  let n = 0;
  for await (const line of lines(path)) if (line.trim() !== '') n++;
  return n;
}

/** `read()`, with a failure (a directory, not Parquet, an I/O error) as invalid_argument naming the dataset. */
async function unreadable<T>(path: string, read: () => Promise<T>): Promise<T> {
  try {
    return await read();
  } catch (err) {
    if (err instanceof RolloutError) throw err;
    throw new RolloutError('invalid_argument', `cannot read dataset ${path}: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * Streams the rows: JSONL line by line (a leading BOM and CRLF line ends tolerated), Parquet in chunks of rows. A
 * JSONL line that is not a JSON object is yielded as a {@link BadRow} naming file and line, for the runner to report
 * and go on; a file that cannot be read throws.
 */
export async function* readDataset(path: string): AsyncGenerator<DatasetRow | BadRow> {
  if (datasetFormat(path) === 'parquet') {
    const file = await openParquet(path);
    const metadata = await unreadable(path, () => parquetMetadataAsync(file));
    const total = Number(metadata.num_rows);
    for (let start = 0; start < total; start += PARQUET_CHUNK_ROWS) {
      const rows = await unreadable(path, () => parquetReadObjects({ file, metadata, rowStart: start, rowEnd: Math.min(total, start + PARQUET_CHUNK_ROWS) }));
      for (const [i, row] of rows.entries()) yield { index: start + i, row: plain(row) as Record<string, unknown> };
    }
    return;
  }
  let index = 0;
  let lineNumber = 0;
  for await (const line of lines(path)) {
    lineNumber++;
    if (line.trim() === '') continue;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch (err) {
      yield { index: index++, problem: `${path}:${lineNumber}: not JSON (${shortened((err as Error).message)})` };
      continue;
    }
    if (typeof row !== 'object' || row === null || Array.isArray(row)) yield { index: index++, problem: `${path}:${lineNumber}: a row must be a JSON object` };
    else yield { index: index++, row: row as Record<string, unknown>, line: lineNumber };
  }
}

/** V8's JSON.parse message quotes the start of the input: bounded, so a huge bad line is not echoed whole. */
function shortened(message: string): string {
  return message.length <= 200 ? message : `${message.slice(0, 200)}...`;
}

async function openParquet(path: string): Promise<Awaited<ReturnType<typeof asyncBufferFromFile>>> {
  try {
    return await asyncBufferFromFile(path);
  } catch (err) {
    throw new RolloutError('invalid_argument', `cannot read dataset ${path}: ${(err as Error).message}`);
  }
}

/** The file's lines, CRLF or LF, without a UTF-8 BOM (editors on Windows write one; JSON.parse refuses it). */
async function* lines(path: string): AsyncGenerator<string> {
  const stream = createReadStream(path, { encoding: 'utf8' });
  stream.on('error', () => undefined); // surfaces through the iterator below
  let first = true;
  const reader = createInterface({ input: stream, crlfDelay: Infinity })[Symbol.asyncIterator]();
  for (;;) {
    const next = await unreadable(path, () => reader.next());
    if (next.done === true) return;
    yield first && next.value.startsWith('\uFEFF') ? next.value.slice(1) : next.value;
    first = false;
  }
}

/** Parquet INT64 values arrive as bigint; JSON (the instance is a Struct) wants numbers. */
function plain(value: unknown): unknown {
  if (typeof value === 'bigint') return Number.isSafeInteger(Number(value)) ? Number(value) : value.toString();
  if (Array.isArray(value)) return value.map(plain);
  if (value instanceof Date) return value.toISOString();
  if (value instanceof Uint8Array) return Buffer.from(value).toString('base64');
  if (typeof value === 'object' && value !== null) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]));
  return value;
}

/** What one row becomes: the instance, and metadata echoed back in every trajectory of it. */
export interface MappedRow {
  instance: Record<string, unknown>;
  metadata: Record<string, string>;
}

interface VerlRow {
  prompt: Array<{ role?: unknown; content?: unknown }>;
  reward_model: { ground_truth?: unknown };
}

function isVerlRow(row: Record<string, unknown>): row is Record<string, unknown> & VerlRow {
  const rm = row.reward_model;
  return Array.isArray(row.prompt) && typeof rm === 'object' && rm !== null && 'ground_truth' in rm;
}

/**
 * Maps a row to the instance of `environment` (see the file comment). Throws RolloutError('invalid_argument')
 * naming the row when it cannot be mapped: the runner reports it and goes on with the other rows.
 */
export function mapRow({ index, row }: DatasetRow, environment: string, instanceField?: string): MappedRow {
  const metadata: Record<string, string> = { row_index: String(index) };
  for (const key of ['data_source', 'ability'] as const) if (typeof row[key] === 'string') metadata[key] = row[key];
  if (row.extra_info !== undefined && row.extra_info !== null) metadata.extra_info = JSON.stringify(row.extra_info);
  if (instanceField !== undefined) {
    let value = row[instanceField];
    if (typeof value === 'string') {
      try {
        value = JSON.parse(value);
      } catch {
        throw new RolloutError('invalid_argument', `row ${index}: field ${instanceField} is a string that is not JSON`);
      }
    }
    if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new RolloutError('invalid_argument', `row ${index}: field ${instanceField} is not an object`);
    return { instance: value as Record<string, unknown>, metadata };
  }
  if (environment === 'math' && isVerlRow(row)) {
    const user = row.prompt.findLast((m) => m.role === 'user');
    if (typeof user?.content !== 'string') throw new RolloutError('invalid_argument', `row ${index}: prompt has no user message`);
    const truth = row.reward_model.ground_truth;
    const first: unknown = Array.isArray(truth) ? truth[0] : truth;
    // Anything else (null, an empty list, an object) would be the answer "null", "undefined" or "[object Object]": every
    // sample scored 0 against it, read as the policy's failure.
    const usable = (typeof first === 'string' && first.trim() !== '') || (typeof first === 'number' && Number.isFinite(first));
    if (!usable) throw new RolloutError('invalid_argument', `row ${index}: reward_model.ground_truth is ${shortened(JSON.stringify(truth) ?? 'missing')}: not an answer (a string, a number, or a list whose first element is one)`);
    const answer = typeof truth === 'number' ? truth : String(first);
    return { instance: { problem: user.content, answer }, metadata };
  }
  return { instance: row, metadata };
}

/**
 * The task id of a row: `<dataset>-<row>-<content>`, from the dataset's real path, the row's index and a hash of
 * what is submitted (environment, instance, samples, and the sampling flags when given), so a re-run finds the same
 * ids (resume, and the server's idempotent submit) while an edited row, other options or another dataset get new ones
 * (and the runner refuses an output whose rows have other ids: submit.ts).
 */
export function taskIdFor(datasetPath: string, index: number, environment: string, instance: Record<string, unknown>, numSamples: number, sampling?: object): string {
  // The sampling flags only when given: the ids of a run without them are those of every earlier version.
  const content = hash(canonicalJson({ environment, instance, numSamples, ...(sampling !== undefined && { sampling }) })).slice(0, 12);
  return `${datasetTag(datasetPath)}-${index}-${content}`;
}

/** `ds-<hash of the dataset's real path>`: what every task id of the dataset's rows starts with. */
export function datasetTag(datasetPath: string): string {
  return `ds-${hash(realpathSync(datasetPath)).slice(0, 10)}`;
}

function hash(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}
