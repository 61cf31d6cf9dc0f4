/**
 * The journal's record kinds and key layout (LMDB keys are ordered-binary arrays, so each kind is one range).
 * Values are msgpack (lmdb-js's default encoding); trajectories and specs are stored as the protobuf bytes the
 * server already has, so recovery decodes exactly what the streams send.
 */

/** `['t', taskId]`: an accepted task, written (and fsynced) before TaskAccepted is sent. */
export interface TaskRecord {
  /** The TaskSpec as received (protobuf bytes): validated again at recovery, so its seeds and samples are the same. */
  spec: Uint8Array;
  numSamples: number;
  /** The session that submitted it; '' for the unary Submit. */
  session: string;
  acceptedAt: number;
}

/**
 * `['o', taskId, sessionId]`: the task is owed to that session too — a session other than the one in its TaskRecord
 * that was answered `accepted` for it as a duplicate (a restarted trainer re-submitting under a new session id; a
 * stream session re-submitting a task first sent by the unary Submit). Written (and fsynced) before that `accepted`
 * is sent. Its acks are `['o', taskId, sessionId, sample]` (value 1), beside it: an ack settles the debt of the
 * session that sent it only. The TaskRecord's own session keeps its acks at `['a', taskId, sample]`.
 */
export interface OwnerRecord {
  /** The owed task's `acceptedAt`: ties the record to that acceptance of the task id (a leftover of an older one is removed at open). */
  taskAcceptedAt: number;
  at: number;
}

/**
 * `['l', taskId, sessionId]`: a task whose record could not be read at a start (quarantined: its spec and trajectories
 * are gone) was owed to that session, which is owed a failed trajectory (ENVIRONMENT_ERROR saying `error`, built
 * by recovery) per sample it had not acked, until it acks it — like any trajectory delivered and not acked, so a second
 * crash before the trainer is back still tells it. Written in the transaction that quarantines the task record. Its
 * acks are `['l', taskId, sessionId, sample]` (value 1), beside it; the debt goes once every sample is acked or the
 * session ends. Keyed apart from the task keys: the task id is free (a re-submit is accepted anew) while it is owed.
 */
export interface LostRecord {
  numSamples: number;
  /** Why, as the failed trajectories say it (the same at every start). */
  error: string;
  at: number;
}

/** `['s', sessionId]`: a session that may be resumed. */
export interface SessionRecord {
  openedAt: number;
}

/**
 * `['w']`: the pool-wide weight-sync state, rewritten by each pool-wide PauseGeneration and ResumeGeneration, so a
 * server restarted mid-run tags tokens with the version its engines serve (not 0) and, restarted during a weight
 * update, comes back paused (it must not send requests to engines whose weights are being replaced).
 */
export interface WeightsRecord {
  paused: boolean;
  policyVersion: number;
  at: number;
}

/**
 * A journaled task as recovery sees it: its record, the bytes of its finished samples, the samples its session acked,
 * and the other sessions it is owed to with the samples each of them acked.
 */
export interface JournalTask extends TaskRecord {
  taskId: string;
  finished: Map<number, Uint8Array>;
  acked: Set<number>;
  owners: Map<string, Set<number>>;
}

/**
 * A task whose record could not be read at start-up (quarantined with its trajectories and acks): what its keys and
 * the readable parts of its record still say of whom it was owed to, so those sessions are told it is lost instead of
 * waiting for it. `numSamples` is the record's, else one past the highest sample index its other records name;
 * undefined when nothing says (the loss is then logged and counted only).
 */
export interface LostTask {
  taskId: string;
  numSamples: number | undefined;
  /** Sessions it was owed to ('' excluded: a unary Submit), each with the samples it had acked. */
  debts: Map<string, Set<number>>;
}

/** What a session is owed of a lost task ({@link LostRecord}), with the samples it acked. */
export interface LostDebt {
  taskId: string;
  session: string;
  numSamples: number;
  error: string;
  acked: Set<number>;
}

/** What the journal keeps in memory per task (never trajectory bytes). */
export interface TaskIndex {
  numSamples: number;
  session: string;
  acceptedAt: number;
  finished: Set<number>;
  /** Acked by `session`. */
  acked: Set<number>;
  /** Other sessions the task is owed to (OwnerRecord), each with the samples it acked; absent while there are none. */
  owners?: Map<string, Set<number>>;
}

const TOP = '\uffff';

/**
 * The journal's format version, stored at `['v']` when a journal is created: a server refuses a journal with a
 * higher one (written by a newer format it cannot read) instead of quarantining all of it.
 *
 * Bumped when an older server would misread what a newer one writes. A record kind in a key range older servers do
 * not scan is not such a change: the owner records (`['o', ...]`, OwnerRecord) came at version 1 — a server from
 * before them opens such a journal, ignores them (owing each task to its submitting session only, as it always did)
 * and leaves them behind, and a newer server removes those left without their task at open. The lost-task debts
 * (`['l', ...]`, LostRecord) are such a kind too: an older server does not tell them.
 */
export const FORMAT_VERSION = 1;

export const keys = {
  TOP,
  version: ['v'],
  weights: ['w'],
  session: (id: string) => ['s', id],
  task: (id: string) => ['t', id],
  result: (taskId: string, sample: number) => ['r', taskId, sample],
  ack: (taskId: string, sample: number) => ['a', taskId, sample],
  owner: (taskId: string, session: string) => ['o', taskId, session],
  ownerAck: (taskId: string, session: string, sample: number) => ['o', taskId, session, sample],
  sessions: { start: ['s'], end: ['s', TOP] },
  tasks: { start: ['t'], end: ['t', TOP] },
  results: { start: ['r'], end: ['r', TOP] },
  acks: { start: ['a'], end: ['a', TOP] },
  owners: { start: ['o'], end: ['o', TOP] },
  lost: (taskId: string, session: string) => ['l', taskId, session],
  lostAck: (taskId: string, session: string, sample: number) => ['l', taskId, session, sample],
  losts: { start: ['l'], end: ['l', TOP] },
  /** Every record of one task but its TaskRecord: results, acks, owners and their acks. */
  ofTask: (taskId: string) => [
    { start: ['r', taskId], end: ['r', taskId, TOP] },
    { start: ['a', taskId], end: ['a', taskId, TOP] },
    { start: ['o', taskId], end: ['o', taskId, TOP] },
  ],
};

/** Whether a write failed for lack of space: LMDB's map is full, or the file system is (ENOSPC) or over quota. */
export function isFull(err: unknown): boolean {
  const e = err as { code?: unknown; message?: unknown } | undefined;
  const text = `${String(e?.code ?? '')} ${String(e?.message ?? err)}`;
  return /ENOSPC|EDQUOT|MDB_MAP_FULL|No space left|quota exceeded|MDB_TXN_FULL/i.test(text);
}

/** Whether a value read at `['t', id]` is a TaskRecord of this format (anything else is quarantined at open). */
export function validTaskRecord(value: unknown): value is TaskRecord {
  const r = value as Partial<TaskRecord> | null | undefined;
  return (
    typeof r === 'object' &&
    r !== null &&
    r.spec instanceof Uint8Array &&
    Number.isInteger(r.numSamples) &&
    r.numSamples! > 0 &&
    typeof r.session === 'string' &&
    typeof r.acceptedAt === 'number'
  );
}

/** Whether a value read at `['o', taskId, sessionId]` is an OwnerRecord. */
export function validOwnerRecord(value: unknown): value is OwnerRecord {
  const r = value as Partial<OwnerRecord> | null | undefined;
  return typeof r === 'object' && r !== null && typeof r.taskAcceptedAt === 'number' && typeof r.at === 'number';
}

/** Whether a value read at `['l', taskId, sessionId]` is a LostRecord. */
export function validLostRecord(value: unknown): value is LostRecord {
  const r = value as Partial<LostRecord> | null | undefined;
  return typeof r === 'object' && r !== null && Number.isInteger(r.numSamples) && r.numSamples! > 0 && typeof r.error === 'string' && typeof r.at === 'number';
}

/** Whether `index` is a sample index of a task with `numSamples` samples. */
export function inRange(index: unknown, numSamples: number): index is number {
  return typeof index === 'number' && Number.isInteger(index) && index >= 0 && index < numSamples;
}
