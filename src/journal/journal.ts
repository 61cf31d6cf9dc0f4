import { existsSync, mkdirSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { statfs } from 'node:fs/promises';
import { open, type Key, type RootDatabase } from 'lmdb';
import { RolloutError } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import type { Ack } from '../../gen/ts/rollout/v1/rollout.js';
import { CommitHealth } from './commit-health.js';
import { errorText, writeFailureText } from './error-text.js';
import { DirLock } from './dir-lock.js';
import { checkJournalReadable, damagedAdvice, isDamaged } from './integrity-check.js';
import { silenceLmdbCommitPrints } from './lmdb-console.js';
import { FORMAT_VERSION, inRange, isFull, keys, validLostRecord, validOwnerRecord, validTaskRecord, type JournalTask, type LostDebt, type LostRecord, type LostTask, type OwnerRecord, type SessionRecord, type TaskIndex, type TaskRecord, type WeightsRecord } from './records.js';

export interface JournalOptions {
  dir: string;
  /** Bound on the live data (pages in use) of the journal; past it, after compaction, admission fails. */
  maxBytes: number;
  logger: Logger;
  /**
   * Whether a finished task must still be kept for GetTrajectory (the task store still holds it). Compaction drops
   * a finished, fully acknowledged task only once this says no, so the journal never forgets what memory still
   * serves.
   */
  retained?: (taskId: string) => boolean;
  /**
   * Asks the owner of `retained` to let go of its oldest retained finished tasks; returns how many it let go (0: none
   * left). Called when an accept finds the bound reached and compaction alone freed too little.
   */
  shed?: () => number;
  /** How often compaction runs in the background (besides when an accept finds the bound reached). */
  compactEveryMs?: number;
  /** How often a journal that cannot commit tries a small commit to learn it can again (see CommitHealth). */
  commitProbeMs?: number;
  /**
   * How long a write a client is answered on (an accept, an owner record, a trajectory, the weights record) waits for
   * its commit before it is given up as failed (config `journal.commitTimeoutMs`; default {@link COMMIT_TIMEOUT_MS}).
   */
  commitTimeoutMs?: number;
}

/** How long a write waits for its commit by default: an fsync that takes longer is a disk that does not answer. */
export const COMMIT_TIMEOUT_MS = 30_000;

/**
 * A commit that did not complete within the journal's commitTimeoutMs (an fsync that does not return: a stuck disk,
 * an NFS server gone). The write is still queued in LMDB: it may commit later, or fail.
 */
class CommitTimedOut extends Error {}

/** What the journal held at open: what start-up recovery rebuilds the server from. */
export interface JournalContents {
  sessions: string[];
  /** Accepted tasks, oldest first. */
  tasks: JournalTask[];
  /** The pool-wide weight-sync state last recorded (none before the first pool-wide pause or resume). */
  weights?: WeightsRecord;
  /** Records that could not be read at open, moved aside to the quarantine range (`['x', ...key]`), not deleted. */
  quarantined: number;
}

/**
 * The durable journal: accepted tasks (their spec as received and the session that submitted them), the other
 * sessions each is owed to, the bytes of every finished trajectory, acks (per session owed), and open sessions, in
 * LMDB (lmdb-js).
 *
 * Why LMDB: a copy-on-write B-tree whose commit is one meta-page switch, so a `kill -9` (or a failed write on a
 * full disk) leaves the last committed state intact — there is no log to replay or repair; reads are synchronous
 * from a memory map; the map size bounds the file; and lmdb-js ships prebuilt binaries as npm optional packages,
 * so no compiler is needed on a cluster node.
 *
 * Durability: lmdb-js queues writes and commits them in order, in transactions on its own thread, each batching the
 * writes queued while the previous one was being committed; with overlappingSync off, a commit fsyncs before it
 * resolves. An accepted task is therefore written with `put` and TaskAccepted is sent only after that `put`
 * resolved ({@link accepted}): it is on disk, and concurrent accepts share one transaction and one fsync (see
 * bench/journal-accepts.ts). Finished trajectories and acks are written the same way; writes commit in the order
 * they were issued, so an ack is never durable without the trajectory it acknowledges.
 *
 * Ownership: a task is owed to the session that submitted it (in its TaskRecord) and to every session answered
 * `accepted` for it later as a duplicate while it did not hold it ({@link owed}: an OwnerRecord, durable before that
 * answer); each such session is owed every sample until it acks it, and an ack settles the debt of the session that
 * sent it, no other's. So after a crash every session that was owed a trajectory is owed it again, as in memory. A
 * session id opened again without resume starts clean ({@link sessionOpened}); a task the journal holds keeps its id
 * taken after the task store let go of it ({@link held}); a task record that cannot be read leaves, in
 * {@link lostTasks}, whom it was owed to, for recovery to tell them.
 *
 * Invariant: keys are `['v']` (the format version), `['w']`, `['s', session]`, `['t', task]`, `['r', task, sample]`
 * (trajectory bytes), `['a', task, sample]` (acked by the task's session), `['o', task, session]` (OwnerRecord) and
 * `['o', task, session, sample]` (acked by that owner), `['l', task, session]` (LostRecord: a lost task's failed
 * trajectories owed to a live session) and `['l', task, session, sample]` (acked by it); a trajectory, ack or owner
 * key exists only beside its task key, a lost debt only while its session does and not every sample of it is acked
 * (a task is compacted in one transaction; leftovers are removed at open and before an accept of the same id), and an
 * owner's ack only beside its owner key. `['x', ...key]` holds records quarantined at start-up, never read. One
 * journal per directory at a time (DirLock). An in-memory index mirrors the task keys (small: ids, sample sets and
 * owners, never trajectories) so compaction and acks need no scan.
 */
export class Journal {
  private readonly db: RootDatabase;
  private readonly lock: DirLock;
  private readonly log: Logger;
  private quarantinedCount = 0;
  private readonly lost: LostTask[] = [];
  /** Lost tasks' debts (LostRecord), by task id then session. */
  private readonly lostDebts = new Map<string, Map<string, LostDebt>>();
  private readonly tasks = new Map<string, TaskIndex>();
  private readonly sessions = new Set<string>();
  /** Owner writes under way ({@link owed}), by `[task, session]`: a second call for the same pair waits for the first. */
  private readonly owing = new Map<string, Promise<void>>();
  private full: string | undefined;
  /**
   * Whether {@link full} is the disk's (a write failed for want of space), not the size bound's: compaction frees pages
   * inside the file, never room on the disk, so only a commit that succeeds clears it (see {@link settled}).
   */
  private diskFull = false;
  /** Why what this journal writes would not survive a restart (its files removed, its directory taken): for good. */
  private gone: string | undefined;
  /** data.mdb as opened: a file at its path with another inode is not the one LMDB writes to. */
  private dataFile: { dev: number; ino: number } = { dev: 0, ino: 0 };
  private closed = false;
  /** The `acceptedAt` of the last task accepted: each is later than the one before (see {@link forgetRefused}). */
  private lastAcceptedAt = 0;
  private readonly compactor: NodeJS.Timeout;
  /** Whether the last commit failed (a failing or full disk): set by {@link settled}, probed until one succeeds. */
  private readonly commits: CommitHealth;
  /** The format version at `['v']` as opened: what the commit probe writes again (the same value). */
  private version: number = FORMAT_VERSION;
  /** Told when admission through the journal becomes impossible (a reason) or possible again (undefined). */
  onFullChange: ((reason: string | undefined) => void) | undefined;
  /** Told when the journal can no longer commit (a reason, see {@link commitFailure}) or can again (undefined). */
  onCommitChange: ((reason: string | undefined) => void) | undefined;

  private constructor(private readonly options: JournalOptions) {
    this.log = options.logger.child({ component: 'journal' });
    silenceLmdbCommitPrints();
    this.commits = new CommitHealth({
      log: this.log,
      // The version record written again as it is: a commit (and fsync) that changes nothing an older server reads.
      probe: async () => void (await this.settled(this.db.put(keys.version, this.version))),
      onChange: () => this.onCommitChange?.(this.commits.reason),
      ...(options.commitProbeMs !== undefined && { probeEveryMs: options.commitProbeMs }),
    });
    try {
      mkdirSync(options.dir, { recursive: true });
    } catch (err) {
      throw notADirectory(err, options.dir) ?? cannotOpen(err, options.dir);
    }
    // One server per directory, taken before LMDB is opened (two would re-run the same samples and compact away
    // each other's tasks). Released by close, or here when the open fails.
    try {
      this.lock = DirLock.acquire(options.dir);
    } catch (err) {
      throw cannotOpen(err, options.dir);
    }
    // The map is the hard ceiling LMDB enforces (MDB_MAP_FULL); the soft bound (maxBytes) is checked before each
    // accept, with room left above it for the trajectories and acks of work already accepted.
    // eventTurnBatching off: with it on, lmdb-js 3.5 starts each batch with an internal write whose promise nobody
    // holds, so a failed commit (a full disk) becomes an unhandled rejection that ends the process. Off, writes are
    // still committed in order and batched (those queued while a commit is under way go into the next one).
    // overlappingSync off: each commit fsyncs before it resolves (LMDB's own durable commit), so a write's promise
    // is its durability. With it on, `db.flushed` waits for the latest batch's flush, which never comes when that
    // batch's commit fails (a full disk) — an accept committed before it would wait forever.
    const file = join(options.dir, 'data.mdb');
    const existed = existsSync(file);
    try {
      this.db = open({ path: options.dir, mapSize: Math.max(options.maxBytes * 2, 64 << 20), compression: false, eventTurnBatching: false, overlappingSync: false });
    } catch (err) {
      this.lock.release();
      throw cannotOpen(err, options.dir);
    }
    try {
      const { dev, ino, size } = statSync(file);
      this.dataFile = { dev, ino };
      this.checkFileSize();
      // Garbage in a page can end this process with SIGSEGV when it is read: read it first where that costs nothing.
      if (existed) checkJournalReadable(options.dir, file, size, this.log);
      this.checkVersion();
    } catch (err) {
      void this.db.close();
      this.lock.release();
      throw cannotOpen(err, options.dir);
    }
    // A commit that does not complete is one line (CommitHealth logged the outage); anything else with its stack.
    this.compactor = setInterval(() => void this.compact().catch((err: unknown) => this.log.error(err instanceof CommitTimedOut ? { reason: err.message } : { err }, 'journal compaction failed')), options.compactEveryMs ?? 60_000);
    this.compactor.unref();
  }

  /** Opens (or creates) the journal in `dir` and reads what it holds. */
  static open(options: JournalOptions): { journal: Journal; contents: JournalContents } {
    const journal = new Journal(options);
    try {
      return { journal, contents: journal.load() };
    } catch (err) {
      // Not served: the store is closed and the directory released, so a corrected start can take it.
      clearInterval(journal.compactor);
      journal.commits.close();
      journal.closed = true;
      void journal.db.close();
      journal.lock.release();
      throw cannotOpen(err, options.dir);
    }
  }

  /**
   * A data.mdb shorter than the pages LMDB's meta page says are in use (an interrupted copy or rsync) would be read
   * past its end through the memory map: SIGBUS, the process gone without a word. Checked before any data page is
   * read; LMDB's stats come from the meta pages alone.
   */
  private checkFileSize(): void {
    const file = join(this.options.dir, 'data.mdb');
    const { pageSize, lastPageNumber } = this.db.getStats() as { pageSize: number; lastPageNumber: number };
    const needed = (lastPageNumber + 1) * pageSize;
    const size = statSync(file).size;
    if (size < needed) {
      throw new RolloutError('failed_precondition', `journal.dir: ${file} is truncated (${size} bytes; its pages in use need ${needed}): restore the journal directory from a complete copy, or move it aside to start empty`, { field: 'journal.dir' });
    }
  }

  /** Stamps a new journal with the format version; refuses one written by a newer format than this server reads. */
  private checkVersion(): void {
    const version = this.db.get(keys.version) as unknown;
    if (version === undefined) {
      // A new journal, or one written before the version key existed (the same format): stamped now.
      this.db.putSync(keys.version, FORMAT_VERSION);
      return;
    }
    if (typeof version !== 'number' || !Number.isInteger(version) || version > FORMAT_VERSION) {
      throw new RolloutError('failed_precondition', `journal.dir: the journal in ${this.options.dir} has format version ${JSON.stringify(version)}; this server reads version ${FORMAT_VERSION} and older (a newer server wrote it)`, { field: 'journal.dir' });
    }
    this.version = version;
  }

  /**
   * Reads every record, checking its shape; one that cannot be read (a partial or hand edit, another version's
   * shape) is moved aside ({@link quarantine}) and the rest is loaded. Results and acks without a task (left by a
   * compaction cut short by a kill -9, or beside a quarantined task) are removed, so a later task with the same id
   * does not inherit them.
   */
  private load(): JournalContents {
    for (const key of this.db.getKeys(keys.sessions)) this.sessions.add((key as string[])[1]!);
    const tasks = new Map<string, JournalTask>();
    const orphans: unknown[][] = [];
    // Before the tasks: a task record quarantined below adds its debts to these.
    this.loadLostDebts(orphans);
    for (const key of this.db.getKeys(keys.tasks)) {
      const taskId = (key as unknown[])[1];
      const record = this.read(key);
      if (typeof taskId !== 'string' || !validTaskRecord(record)) {
        this.quarantine(key as unknown[], 'not a task record this version writes');
        continue;
      }
      tasks.set(taskId, { taskId, ...record, spec: new Uint8Array(record.spec), finished: new Map(), acked: new Set(), owners: new Map() });
    }
    for (const key of this.db.getKeys(keys.results)) {
      const [, taskId, index] = key as [string, unknown, unknown];
      const task = typeof taskId === 'string' ? tasks.get(taskId) : undefined;
      if (!task) {
        orphans.push(key as unknown[]);
        continue;
      }
      const value = this.read(key);
      if (!inRange(index, task.numSamples) || !(value instanceof Uint8Array)) {
        this.quarantine(key as unknown[], 'not a trajectory record');
        continue;
      }
      task.finished.set(index, new Uint8Array(value));
    }
    for (const key of this.db.getKeys(keys.acks)) {
      const [, taskId, index] = key as [string, unknown, unknown];
      const task = typeof taskId === 'string' ? tasks.get(taskId) : undefined;
      if (!task) orphans.push(key as unknown[]);
      else if (!inRange(index, task.numSamples)) this.quarantine(key as unknown[], 'not an ack record');
      else task.acked.add(index);
    }
    // An owner key sorts before its acks (a shorter array first), so an owner is known when its acks are read.
    for (const key of this.db.getKeys(keys.owners)) {
      const k = key as unknown[];
      const [, taskId, session, index] = k;
      const task = typeof taskId === 'string' ? tasks.get(taskId) : undefined;
      if (!task) {
        orphans.push(k);
      } else if (typeof session !== 'string' || k.length > 4) {
        this.quarantine(k, 'not an owner record');
      } else if (k.length === 3) {
        const value = this.read(key);
        if (!validOwnerRecord(value)) {
          // Its key still says the task is owed to that session: the debt is kept (owed once more at worst, which a
          // client dedupes; dropped, the session would wait for it forever). Only the value is moved aside.
          this.quarantineOwnerValue(k, task.acceptedAt);
          task.owners.set(session, new Set());
        }
        // Left by an older acceptance of this task id (an older server compacts without removing owner records).
        else if (value.taskAcceptedAt !== task.acceptedAt) orphans.push(k);
        else task.owners.set(session, new Set());
      } else {
        const acked = task.owners.get(session);
        if (!acked) orphans.push(k);
        else if (!inRange(index, task.numSamples)) this.quarantine(k, 'not an ack record');
        else acked.add(index);
      }
    }
    if (orphans.length > 0) {
      this.db.transactionSync(() => {
        for (const key of orphans) void this.db.remove(key as Key[]);
      });
      this.log.warn({ records: orphans.length }, 'journal: removed results, acks and owners left without their task (a compaction cut short, or done by an older server)');
    }
    for (const t of tasks.values()) {
      const index: TaskIndex = { numSamples: t.numSamples, session: t.session, acceptedAt: t.acceptedAt, finished: new Set(t.finished.keys()), acked: new Set(t.acked) };
      if (t.owners.size > 0) index.owners = new Map([...t.owners].map(([s, acked]) => [s, new Set(acked)]));
      this.tasks.set(t.taskId, index);
    }
    this.log.info({ dir: this.options.dir, tasks: tasks.size, sessions: this.sessions.size, bytes: this.usedBytes(), quarantined: this.quarantinedCount }, 'journal opened');
    const weights = this.read(keys.weights) as WeightsRecord | undefined;
    return {
      sessions: [...this.sessions],
      tasks: [...tasks.values()].sort((a, b) => a.acceptedAt - b.acceptedAt),
      ...(weights && { weights }),
      quarantined: this.quarantinedCount,
    };
  }

  /**
   * Reads the lost tasks' debts (`['l', ...]`): a record sorts before its acks. One of a session that is gone, or that
   * every sample of was acked, is an orphan (removed with the others).
   */
  private loadLostDebts(orphans: unknown[][]): void {
    for (const key of this.db.getKeys(keys.losts)) {
      const k = key as unknown[];
      const [, taskId, session, index] = k;
      if (typeof taskId !== 'string' || typeof session !== 'string' || k.length > 4) {
        this.quarantine(k, 'not a lost-task record');
      } else if (!this.sessions.has(session)) {
        orphans.push(k);
      } else if (k.length === 3) {
        const value = this.read(key);
        if (!validLostRecord(value)) this.quarantine(k, 'not a lost-task record');
        else this.debtsOf(taskId).set(session, { taskId, session, numSamples: value.numSamples, error: value.error, acked: new Set() });
      } else {
        const debt = this.lostDebts.get(taskId)?.get(session);
        if (!debt) orphans.push(k);
        else if (!inRange(index, debt.numSamples)) this.quarantine(k, 'not a lost-task ack');
        else debt.acked.add(index);
      }
    }
    for (const debt of this.owedLost()) {
      if (debt.acked.size < debt.numSamples) continue;
      this.lostDebts.get(debt.taskId)!.delete(debt.session);
      orphans.push(keys.lost(debt.taskId, debt.session), ...[...debt.acked].map((i) => keys.lostAck(debt.taskId, debt.session, i)));
    }
  }

  private debtsOf(taskId: string): Map<string, LostDebt> {
    let debts = this.lostDebts.get(taskId);
    if (!debts) this.lostDebts.set(taskId, (debts = new Map()));
    return debts;
  }

  /**
   * What live sessions are owed of lost tasks (read at open, and written as task records were quarantined since):
   * recovery sends each its failed trajectory per sample not acked.
   */
  owedLost(): LostDebt[] {
    return [...this.lostDebts.values()].flatMap((debts) => [...debts.values()]);
  }

  /**
   * Records, in the transaction quarantining the task's record, what each live session it was owed to is owed of its
   * loss: a failed trajectory per sample it had not acked. Merged with what an earlier loss of the same id still owes
   * the session (a sample is settled only where both say so). Nothing when its sample count could not be read.
   */
  private oweLost(lost: LostTask): void {
    const { taskId, numSamples } = lost;
    if (numSamples === undefined) return;
    const error = `after a server restart: the journal's record of task "${taskId}" could not be read (moved aside to its quarantine range ['x', 't', ...]), so its spec and trajectories are lost; submit it again`;
    for (const [session, acked] of lost.debts) {
      if (!this.sessions.has(session)) continue;
      const earlier = this.lostDebts.get(taskId)?.get(session);
      const n = Math.max(numSamples, earlier?.numSamples ?? 0);
      const settled = (i: number): boolean => (i >= numSamples || acked.has(i)) && (!earlier || i >= earlier.numSamples || earlier.acked.has(i));
      const debt: LostDebt = { taskId, session, numSamples: n, error, acked: new Set(Array.from({ length: n }, (_, i) => i).filter(settled)) };
      if (earlier) {
        this.lostDebts.get(taskId)!.delete(session);
        void this.db.remove(keys.lost(taskId, session));
        for (const i of earlier.acked) void this.db.remove(keys.lostAck(taskId, session, i));
      }
      if (debt.acked.size >= n) continue;
      this.debtsOf(taskId).set(session, debt);
      void this.db.put(keys.lost(taskId, session), { numSamples: n, error, at: Date.now() } satisfies LostRecord);
      for (const i of debt.acked) void this.db.put(keys.lostAck(taskId, session, i), 1);
    }
  }

  /** Forgets a lost debt in memory (every sample acked, or its session gone); {@link removeLost} writes it. */
  private forgetLost(debt: LostDebt): void {
    const debts = this.lostDebts.get(debt.taskId);
    debts?.delete(debt.session);
    if (debts?.size === 0) this.lostDebts.delete(debt.taskId);
  }

  /** The removal of a lost debt's records, for a transaction. */
  private removeLost(debt: LostDebt): void {
    void this.db.remove(keys.lost(debt.taskId, debt.session));
    for (const i of debt.acked) void this.db.remove(keys.lostAck(debt.taskId, debt.session, i));
  }

  /** A record's value, or undefined when it does not decode. */
  private read(key: unknown): unknown {
    try {
      return this.db.get(key as string[]);
    } catch {
      return undefined;
    }
  }

  /**
   * Moves a record that cannot be read out of the way, without deleting it: its bytes as stored go to
   * `['x', ...key]` (a range nothing reads), in one transaction with the removal. A quarantined task takes its
   * results and acks with it, and what its sessions are owed of its loss is recorded in that transaction
   * ({@link oweLost}). Logged (warn, with the key) and counted; for start-up (synchronous).
   */
  quarantine(key: readonly unknown[], reason: string): void {
    const moved: unknown[][] = [[...key]];
    let lost: LostTask | undefined;
    if (key[0] === 't' && typeof key[1] === 'string') {
      const taskId = key[1];
      lost = this.lostTask(taskId);
      this.lost.push(lost);
      for (const range of keys.ofTask(taskId)) for (const k of this.db.getKeys(range)) moved.push(k as unknown[]);
      this.tasks.delete(taskId);
    } else if (key[0] === 'l' && typeof key[1] === 'string' && typeof key[2] === 'string') {
      const debt = this.lostDebts.get(key[1])?.get(key[2]);
      if (key.length === 3) {
        // A lost debt takes its acks along (its loss was logged when its task was quarantined).
        const record = keys.lost(key[1], key[2]);
        for (const k of this.db.getKeys({ start: record, end: [...record, keys.TOP] })) if ((k as unknown[]).length > 3) moved.push(k as unknown[]);
        if (debt) this.forgetLost(debt);
      } else if (typeof key[3] === 'number') {
        debt?.acked.delete(key[3]); // told once more at worst
      }
    } else if ((key[0] === 'r' || key[0] === 'a') && typeof key[1] === 'string' && typeof key[2] === 'number') {
      const task = this.tasks.get(key[1]);
      task?.finished.delete(key[2]);
      task?.acked.delete(key[2]);
    } else if (key[0] === 'o' && typeof key[1] === 'string' && typeof key[2] === 'string') {
      const session = key[2];
      if (key.length === 3) {
        // An owner takes its acks along.
        const owner = keys.owner(key[1], session);
        for (const k of this.db.getKeys({ start: owner, end: [...owner, keys.TOP] })) if ((k as unknown[]).length > 3) moved.push(k as unknown[]);
        this.tasks.get(key[1])?.owners?.delete(session);
      } else if (typeof key[3] === 'number') {
        this.tasks.get(key[1])?.owners?.get(session)?.delete(key[3]);
      }
    }
    this.db.transactionSync(() => {
      for (const k of moved) {
        const raw = this.db.getBinary(k as string[]);
        if (raw !== undefined) void this.db.put(['x', ...k] as string[], new Uint8Array(raw));
        void this.db.remove(k as string[]);
      }
      if (lost) this.oweLost(lost);
    });
    this.quarantinedCount++;
    this.log.warn({ key, reason, moved: moved.length }, 'journal: a record that cannot be read was moved aside to the quarantine range [x, ...key]');
  }

  /**
   * Whom a task about to be quarantined was owed to, from what can still be read: its record's session and sample
   * count if those decode, its owner keys (an owner record of an older acceptance of the id excepted, when the record
   * says which one it is), its ack keys, and the sample indices its records name.
   */
  private lostTask(taskId: string): LostTask {
    const record = this.read(keys.task(taskId)) as Partial<TaskRecord> | null | undefined;
    const session = typeof record?.session === 'string' ? record.session : undefined;
    const acceptedAt = typeof record?.acceptedAt === 'number' ? record.acceptedAt : undefined;
    const debts = new Map<string, Set<number>>();
    if (session !== undefined) debts.set(session, new Set());
    let top = -1;
    const index = (i: unknown): number | undefined => (typeof i === 'number' && Number.isInteger(i) && i >= 0 ? i : undefined);
    for (const k of this.db.getKeys({ start: ['r', taskId], end: ['r', taskId, keys.TOP] })) top = Math.max(top, index((k as unknown[])[2]) ?? -1);
    for (const k of this.db.getKeys({ start: ['a', taskId], end: ['a', taskId, keys.TOP] })) {
      const i = index((k as unknown[])[2]);
      if (i === undefined) continue;
      top = Math.max(top, i);
      if (session !== undefined) debts.get(session)!.add(i);
    }
    for (const k of this.db.getKeys({ start: ['o', taskId], end: ['o', taskId, keys.TOP] })) {
      const [, , owner, sample] = k as unknown[];
      if (typeof owner !== 'string') continue;
      if ((k as unknown[]).length === 3) {
        const value = this.read(k);
        if (acceptedAt !== undefined && validOwnerRecord(value) && value.taskAcceptedAt !== acceptedAt) continue;
        if (!debts.has(owner)) debts.set(owner, new Set());
        continue;
      }
      const i = index(sample);
      if (i === undefined) continue;
      top = Math.max(top, i);
      debts.get(owner)?.add(i);
    }
    debts.delete('');
    const n = record?.numSamples;
    const numSamples = typeof n === 'number' && Number.isInteger(n) && n > 0 ? n : top >= 0 ? top + 1 : undefined;
    return { taskId, numSamples, debts };
  }

  /** Tasks quarantined since open, with whom they were owed to: recovery tells those sessions they are lost. */
  get lostTasks(): readonly LostTask[] {
    return this.lost;
  }

  /**
   * An owner record whose value cannot be read: its bytes go to the quarantine range and a record of the task's
   * acceptance takes its place (its acks stay beside it); logged and counted like any quarantined record.
   */
  private quarantineOwnerValue(key: unknown[], taskAcceptedAt: number): void {
    this.db.transactionSync(() => {
      const raw = this.db.getBinary(key as string[]);
      if (raw !== undefined) void this.db.put(['x', ...key] as string[], new Uint8Array(raw));
      void this.db.put(key as string[], { taskAcceptedAt, at: Date.now() } satisfies OwnerRecord);
    });
    this.quarantinedCount++;
    this.log.warn({ key }, 'journal: an owner record that cannot be read was moved aside to the quarantine range [x, ...key]; the task stays owed to the session its key names');
  }

  /** Records quarantined since open (at open and by recovery). */
  get quarantined(): number {
    return this.quarantinedCount;
  }

  /** Records the pool-wide weight-sync state (see WeightsRecord); resolves once it is on disk. */
  async weightsChanged(state: { paused: boolean; policyVersion: number }): Promise<void> {
    if (this.closed) return;
    this.checkDir();
    try {
      await this.committedWithin(this.db.put(keys.weights, { ...state, at: Date.now() } satisfies WeightsRecord));
    } catch (err) {
      throw new RolloutError('unavailable', `journal write failed: ${err instanceof CommitTimedOut ? err.message : this.failureLine(err)}`, { cause: err });
    }
  }

  /**
   * A new session (opened without resume). Not awaited by callers: writes commit in order, so it is durable before
   * any task accepted on it.
   *
   * An id used before — a detached session opened again without resume, or one that closed or expired — starts
   * clean, as SessionManager makes it in memory: whatever the journal still owes under that id is forgotten in the
   * same transaction, before anything of the new session, or a restart would hand the earlier session's unacked
   * trajectories to a session that never asked for them (and compaction would keep them for it forever). A task the
   * id submitted is then owed to no session (its record's session becomes '', as a unary Submit's: it still runs
   * after a restart, GetTrajectory finds it); an owner record of the id is removed with its acks, and so is what the
   * id was owed of a lost task.
   */
  sessionOpened(sessionId: string): void {
    if (this.closed) return;
    const submitted: string[] = [];
    const owned: [string, number[]][] = [];
    for (const [taskId, task] of this.tasks) {
      if (task.session === sessionId) {
        submitted.push(taskId);
        task.session = '';
        task.acked = new Set();
      }
      const acked = task.owners?.get(sessionId);
      if (acked) {
        owned.push([taskId, [...acked]]);
        task.owners!.delete(sessionId);
      }
    }
    const lost = this.lostOf(sessionId);
    for (const debt of lost) this.forgetLost(debt);
    this.sessions.add(sessionId);
    const record: SessionRecord = { openedAt: Date.now() };
    if (submitted.length + owned.length + lost.length === 0) return this.write(this.db.put(keys.session(sessionId), record), 'session opened');
    this.write(
      this.db.transaction(() => {
        for (const debt of lost) this.removeLost(debt);
        for (const taskId of submitted) {
          // Read in the transaction: it sees the record of an accept issued just before, whatever its batch.
          const record = this.read(keys.task(taskId)) as TaskRecord | undefined;
          if (record) void this.db.put(keys.task(taskId), { ...record, session: '' } satisfies TaskRecord);
          for (const k of this.db.getKeys({ start: ['a', taskId], end: ['a', taskId, keys.TOP] })) void this.db.remove(k);
        }
        for (const [taskId, acked] of owned) {
          void this.db.remove(keys.owner(taskId, sessionId));
          for (const i of acked) void this.db.remove(keys.ownerAck(taskId, sessionId, i));
        }
        void this.db.put(keys.session(sessionId), record);
      }),
      'session opened',
    );
    this.log.info({ sessionId, tasks: submitted.length + owned.length }, 'session id opened again without resume: what the journal owed its earlier session is forgotten');
  }

  /**
   * A session expired or closed with everything acknowledged: its tasks need no acks any more, and what it was owed of
   * lost tasks goes with it (in one transaction: no debt outlives its session).
   */
  sessionEnded(sessionId: string): void {
    if (this.closed || !this.sessions.delete(sessionId)) return;
    const lost = this.lostOf(sessionId);
    for (const debt of lost) this.forgetLost(debt);
    this.write(
      this.db.transaction(() => {
        void this.db.remove(keys.session(sessionId));
        for (const debt of lost) this.removeLost(debt);
      }),
      'session ended',
    );
  }

  /** The lost debts of one session. */
  private lostOf(sessionId: string): LostDebt[] {
    const out: LostDebt[] = [];
    for (const debts of this.lostDebts.values()) {
      const debt = debts.get(sessionId);
      if (debt) out.push(debt);
    }
    return out;
  }

  /**
   * The journal's copy of a task it still holds (committed: its spec and the bytes of its finished samples), for a
   * re-submit of a task the task store let go of: that task is still owed, maybe, to sessions that have not acked it,
   * so its id is still taken (see RolloutRuntime.revive). Undefined when the journal does not hold it.
   */
  held(taskId: string): { spec: Uint8Array; numSamples: number; finished: Map<number, Uint8Array> } | undefined {
    if (this.closed || !this.tasks.has(taskId)) return undefined;
    const record = this.read(keys.task(taskId));
    if (!validTaskRecord(record)) return undefined;
    const finished = new Map<number, Uint8Array>();
    for (let i = 0; i < record.numSamples; i++) {
      const bytes = this.read(keys.result(taskId, i));
      if (bytes instanceof Uint8Array) finished.set(i, new Uint8Array(bytes));
    }
    return { spec: new Uint8Array(record.spec), numSamples: record.numSamples, finished };
  }

  /**
   * Records an accepted task; resolves once it is on disk (committed and fsynced). Throws RolloutError
   * 'resource_exhausted' naming the journal when it is over its size bound after compaction or the disk is full.
   */
  async accepted(taskId: string, spec: Uint8Array, numSamples: number, session: string): Promise<void> {
    if (this.closed) throw new RolloutError('unavailable', 'the journal is closed (server stopping)');
    this.checkDir();
    // Never over a task it still holds: its record, acks and owners are other sessions' debts (a re-submit of it is
    // its duplicate: RolloutRuntime.revive).
    if (this.tasks.has(taskId)) throw new RolloutError('internal', `the journal still holds task "${taskId}": accepting it anew would drop what it owes`);
    if (this.usedBytes() + spec.length > this.options.maxBytes) {
      try {
        await this.compact();
        // Retained finished tasks are not compacted; past the bound the bound wins: the oldest are let go, then dropped.
        while (this.usedBytes() + spec.length > this.options.maxBytes && (this.options.shed?.() ?? 0) > 0) await this.compact();
      } catch (err) {
        if (err instanceof CommitTimedOut) throw new RolloutError('unavailable', `the journal could not record the task: ${err.message}`, { cause: err });
        throw err;
      }
      const used = this.usedBytes();
      if (used + spec.length > this.options.maxBytes) {
        throw this.markFull(`the journal is full: ${used} bytes in use of its ${this.options.maxBytes}-byte bound (journal.maxBytes), after compaction`);
      }
    }
    // Never the same instant twice: it tells this acceptance's record from a later one of the same id (refused).
    const acceptedAt = (this.lastAcceptedAt = Math.max(Date.now(), this.lastAcceptedAt + 1));
    const record: TaskRecord = { spec, numSamples, session, acceptedAt };
    this.tasks.set(taskId, { numSamples, session, acceptedAt, finished: new Set(), acked: new Set() });
    try {
      // Resolves once the transaction holding it is committed and fsynced (overlappingSync off, see the constructor).
      // Results, acks and owners left under this id (a compaction cut short by a kill -9) go in the same transaction,
      // so the new task never inherits an older task's trajectories or debts.
      await this.committedWithin(
        this.db.transaction(() => {
          for (const range of keys.ofTask(taskId)) for (const k of this.db.getKeys(range)) void this.db.remove(k);
          this.sessionRecorded(session);
          return this.db.put(keys.task(taskId), record);
        }),
      );
    } catch (err) {
      this.tasks.delete(taskId);
      if (err instanceof CommitTimedOut) {
        this.forgetRefused(taskId, acceptedAt);
        throw new RolloutError('unavailable', `the journal could not record the task: ${err.message}`, { cause: err });
      }
      throw await this.failedWrite(err, 'the task');
    }
    try {
      // Checked again once committed: the directory may have gone while the write was under way.
      this.checkDir();
    } catch (err) {
      this.tasks.delete(taskId);
      throw err;
    }
    this.clearFull();
  }

  /**
   * In a transaction owing a task to `session`: its session record, if the write {@link sessionOpened} issued failed (a
   * transient ENOSPC: nobody waits for it). A crash would otherwise find the task owed to a session it does not know,
   * and its trainer's resume would be NOT_FOUND. Read in the transaction: it sees that earlier write if it committed.
   */
  private sessionRecorded(session: string): void {
    if (session === '' || !this.sessions.has(session) || this.db.get(keys.session(session)) !== undefined) return;
    void this.db.put(keys.session(session), { openedAt: Date.now() } satisfies SessionRecord);
  }

  /**
   * Throws UNAVAILABLE when what this journal writes would not be found by a restart on its directory: data.mdb was
   * removed or replaced (an operator's clean-up, a temp-dir reaper: LMDB goes on writing to the unlinked file, gone at
   * the next start), or another server holds the directory (its lock file was removed, and that server took it: two
   * servers on one journal re-run each other's samples and compact away each other's tasks). Neither heals by itself:
   * admission stays refused (rollout.admission NOT_SERVING, the reason logged once) until the server is restarted;
   * the work it accepted before goes on. A stat or two, before and after each write a client is answered on.
   */
  private checkDir(): void {
    if (this.gone === undefined) {
      const file = join(this.options.dir, 'data.mdb');
      let problem: string | undefined;
      try {
        const { dev, ino } = statSync(file);
        if (dev !== this.dataFile.dev || ino !== this.dataFile.ino) problem = `${file} was removed or replaced while this server ran`;
      } catch (err) {
        problem = `${file} was removed or replaced while this server ran (${(err as NodeJS.ErrnoException).code ?? errorText(err)})`;
      }
      problem ??= this.lock.check();
      if (problem === undefined) return;
      this.gone = `journal.dir: ${problem}: a task accepted now would not survive a restart; restart the server`;
      this.log.error({ reason: this.gone }, 'journal unusable: admission fails until the server is restarted');
      this.onFullChange?.(this.gone);
      this.onCommitChange?.(this.gone);
    }
    throw new RolloutError('unavailable', this.gone);
  }

  /**
   * Records that the accepted task `taskId` is owed to `session` from now on: every sample, until that session acks
   * it — whatever it acked of the task before. For a duplicate answered `accepted` on a session that did not hold the
   * task (a restarted trainer's new session, a stream re-submitting a unary task, or the submitting session after it
   * acked everything and forgot the task): in memory such a session is sent every trajectory of the task, so after a
   * crash it must be owed them again. Resolves once on disk (committed and fsynced, sharing the commit of writes
   * issued with it); at once, without a write, when the session is owed every sample already.
   *
   * Throws RolloutError 'unavailable' when the journal is closed or no longer holds the task (compacted a moment
   * ago: submitted again, it is accepted anew), 'resource_exhausted' when the disk is full.
   */
  async owed(taskId: string, session: string): Promise<void> {
    if (this.closed) throw new RolloutError('unavailable', 'the journal is closed (server stopping)');
    this.checkDir();
    const task = this.tasks.get(taskId);
    if (!task) throw new RolloutError('unavailable', `task "${taskId}" was dropped from the journal a moment ago (finished and acknowledged); submit it again`);
    if (!session) return;
    const pair = JSON.stringify([taskId, session]);
    const primary = session === task.session;
    const before = primary ? task.acked : task.owners?.get(session);
    // Owed every sample already — by a write still under way, maybe (the same task sent twice in a row): its fate.
    if (before?.size === 0) return this.owing.get(pair);
    const cleared = [...(before ?? [])];
    if (primary) task.acked = new Set();
    else (task.owners ??= new Map()).set(session, new Set());
    const write = (async (): Promise<void> => {
      try {
        await this.committedWithin(
          this.db.transaction(() => {
            this.sessionRecorded(session);
            if (!before) void this.db.put(keys.owner(taskId, session), { taskAcceptedAt: task.acceptedAt, at: Date.now() } satisfies OwnerRecord);
            for (const i of cleared) void this.db.remove(primary ? keys.ack(taskId, i) : keys.ownerAck(taskId, session, i));
          }),
        );
        this.checkDir();
        // A disk that was full has room again (the soft bound is another matter: accepts check it).
        if (this.full !== undefined && this.usedBytes() < this.options.maxBytes) this.clearFull();
      } catch (err) {
        // Nothing was committed: the debt is as it was (with any ack recorded meanwhile).
        if (this.tasks.get(taskId) === task) {
          if (primary) for (const i of cleared) task.acked.add(i);
          else if (!before) task.owners?.delete(session);
          else for (const i of cleared) task.owners?.get(session)?.add(i);
        }
        const what = `that task "${taskId}" is owed to session "${session}"`;
        if (err instanceof CommitTimedOut) throw new RolloutError('unavailable', `the journal could not record ${what}: ${err.message}`, { cause: err });
        throw await this.failedWrite(err, what);
      }
    })();
    this.owing.set(pair, write);
    const forget = (): void => {
      if (this.owing.get(pair) === write) this.owing.delete(pair);
    };
    write.then(forget, forget);
    return write;
  }

  /** The error for a write whose transaction failed (nothing of it was committed): a full disk, or unavailable. */
  private async failedWrite(err: unknown, what: string): Promise<RolloutError> {
    // The same write may succeed once space is back.
    const free = await this.freeBytes();
    if (isFull(err) || (free !== undefined && free < NEARLY_FULL_BYTES)) {
      const room = free === undefined ? '' : `: ${free} bytes free`;
      return this.markFull(`the journal's disk is full${room} on the file system of ${this.options.dir} (the write failed: ${writeFailureText(err)})`, err, true);
    }
    return new RolloutError('unavailable', `the journal could not record ${what}: ${this.failureLine(err)}`, { cause: err });
  }

  /** A failed write's cause in one line, naming the file: `EIO (input/output error) at <dir>/data.mdb`. */
  private failureLine(err: unknown): string {
    return `${writeFailureText(err)} at ${join(this.options.dir, 'data.mdb')}`;
  }

  private clearFull(): void {
    if (this.full !== undefined) {
      this.full = undefined;
      this.diskFull = false;
      if (this.gone !== undefined) return; // room again, but still unusable
      this.log.info('journal accepts tasks again');
      this.onFullChange?.(undefined);
    }
  }

  /** Records a finished trajectory (its wire bytes); resolves when committed. Rejects on a failed write. */
  async finished(taskId: string, sampleIndex: number, bytes: Uint8Array): Promise<void> {
    const task = this.tasks.get(taskId);
    if (!task || this.closed) return;
    task.finished.add(sampleIndex);
    try {
      await this.committedWithin(this.db.put(keys.result(taskId, sampleIndex), bytes));
    } catch (err) {
      const cause = err instanceof CommitTimedOut ? err.message : this.failureLine(err);
      throw new RolloutError('unavailable', `the journal could not record trajectory ${sampleIndex} of task "${taskId}": ${cause}`, { cause: err });
    }
  }

  /**
   * Records the acks `session` sent (whole tasks: every sample finished so far). An ack settles that session's debt
   * only: one of a task not owed to it (another session's, a unary one) records nothing. Not awaited: an ack has no
   * answer to wait for.
   */
  ack(ack: Ack, session: string): void {
    if (this.closed || !session) return;
    const record = (taskId: string, i: number): void => {
      const task = this.tasks.get(taskId);
      if (!task || !task.finished.has(i)) return;
      const primary = session === task.session;
      const acked = primary ? task.acked : task.owners?.get(session);
      if (!acked || acked.has(i)) return;
      acked.add(i);
      this.write(this.db.put(primary ? keys.ack(taskId, i) : keys.ownerAck(taskId, session, i), 1), 'ack');
    };
    // A lost task's failed trajectory (its id may name a task accepted anew since, too: the session holds one sample
    // per id and index, so its ack settles both, as in memory).
    const lost = (taskId: string, i: number): void => {
      const debt = this.lostDebts.get(taskId)?.get(session);
      if (!debt || !inRange(i, debt.numSamples) || debt.acked.has(i)) return;
      debt.acked.add(i);
      if (debt.acked.size < debt.numSamples) return this.write(this.db.put(keys.lostAck(taskId, session, i), 1), 'ack');
      this.forgetLost(debt);
      this.write(this.db.transaction(() => this.removeLost(debt)), 'ack');
    };
    for (const r of ack.trajectories) {
      record(r.taskId, r.sampleIndex);
      if (this.lostDebts.size > 0) lost(r.taskId, r.sampleIndex);
    }
    // Each task once, however often the ack names it: a whole-task ack stands for every finished sample, so a repeated
    // id would otherwise cost its samples again each time (the ack's entries are bounded, not what they stand for).
    for (const taskId of new Set(ack.taskIds)) {
      for (const i of this.tasks.get(taskId)?.finished ?? []) record(taskId, i);
      // Every failed trajectory of a lost task was sent at once: a whole-task ack stands for all of them.
      const debt = this.lostDebts.get(taskId)?.get(session);
      if (debt) for (let i = 0; i < debt.numSamples; i++) lost(taskId, i);
    }
  }

  /**
   * Drops every task that is finished, acknowledged by every live session it is owed to (none left: closed, expired,
   * or a unary Submit) and no longer retained in memory: its spec, trajectories, acks and owners. Freed pages are
   * reused by LMDB. Returns how many tasks were dropped.
   */
  async compact(): Promise<number> {
    if (this.closed) return 0;
    let dropped = 0;
    const owes = (task: TaskIndex, session: string, acked: ReadonlySet<number>): boolean => session !== '' && this.sessions.has(session) && acked.size < task.numSamples;
    for (const [taskId, task] of this.tasks) {
      if (task.finished.size < task.numSamples) continue;
      if (owes(task, task.session, task.acked)) continue;
      if (task.owners && [...task.owners].some(([session, acked]) => owes(task, session, acked))) continue;
      if (this.options.retained?.(taskId)) continue;
      this.tasks.delete(taskId);
      // One transaction per task: a kill -9 leaves it whole or gone, never results, acks or owners without their task.
      this.write(
        this.db.transaction(() => {
          void this.db.remove(keys.task(taskId));
          for (let i = 0; i < task.numSamples; i++) {
            void this.db.remove(keys.result(taskId, i));
            if (task.acked.has(i)) void this.db.remove(keys.ack(taskId, i));
          }
          for (const [session, acked] of task.owners ?? []) {
            void this.db.remove(keys.owner(taskId, session));
            for (const i of acked) void this.db.remove(keys.ownerAck(taskId, session, i));
          }
        }),
        'compaction',
      );
      dropped++;
    }
    if (dropped > 0) {
      // Bounded: an accept past the bound waits here for the pages compaction freed.
      await this.within(Promise.resolve(this.db.committed).catch(() => undefined));
      this.log.info({ dropped, bytes: this.usedBytes() }, 'journal compacted');
    }
    // Admission (and the rollout.admission health status) comes back as soon as compaction made room, not only at
    // the next accepted task: a balancer routing by that status would never send it. Room under the bound, that is:
    // a full disk is not emptied by compaction, so it waits for a commit that succeeds (settled).
    if (this.full !== undefined && !this.diskFull && this.usedBytes() < this.options.maxBytes) this.clearFull();
    return dropped;
  }

  /** Bytes of the pages the journal's data occupies now (what the size bound limits). */
  usedBytes(): number {
    const s = this.db.getStats() as { pageSize: number; treeBranchPageCount: number; treeLeafPageCount: number; overflowPages: number };
    return s.pageSize * (s.treeBranchPageCount + s.treeLeafPageCount + s.overflowPages);
  }

  /** Why admission fails, while the journal is full (or for good, when its directory went: see checkDir). */
  get fullReason(): string | undefined {
    return this.gone ?? this.full;
  }

  /**
   * Why nothing sent to this server can be made durable now: its last commit failed (a failing or full disk; cleared
   * by the next commit that succeeds, probed every few seconds, see CommitHealth), or its directory went (for good).
   * Undefined while it commits.
   */
  get commitFailure(): string | undefined {
    return this.gone ?? this.commits.reason;
  }

  get taskCount(): number {
    return this.tasks.size;
  }

  /** Waits for every write issued to be committed (or to have failed), then closes the store. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.compactor);
    this.commits.close();
    // Every write issued so far is committed (and so fsynced) or has failed and was reported where it was issued.
    await Promise.resolve(this.db.committed).catch(() => undefined);
    await this.db.close();
    this.lock.release();
  }

  private markFull(reason: string, cause?: unknown, disk = false): RolloutError {
    const first = this.full === undefined;
    this.full = reason; // before telling: whoever is told reads fullReason
    this.diskFull = disk;
    if (first) {
      // One line: the cause is in the reason (its stack went to debug with the failed commit).
      this.log.error({ reason }, 'journal full: admission fails until space is freed');
      this.onFullChange?.(reason);
    }
    return new RolloutError('resource_exhausted', reason, { cause });
  }

  private write(done: Promise<unknown>, what: string): void {
    // One line with the cause (its stack is logged at debug by the commit failure, see settled).
    this.settled(done).catch((err: unknown) => this.log.warn({ what, reason: `journal write failed: ${this.failureLine(err)}` }, 'journal write failed'));
  }

  /**
   * {@link settled}, for a write a client is answered on: bounded by commitTimeoutMs ({@link within}).
   */
  private committedWithin<T>(done: Promise<T>): Promise<T> {
    return this.within(this.settled(done));
  }

  /**
   * `done`, or a CommitTimedOut once it has waited commitTimeoutMs: the journal then cannot commit (CommitHealth:
   * RolloutService NOT_SERVING) until a commit completes — the late one itself, or the probe queued behind it, which
   * {@link settled} reports as a success. The write stays queued in LMDB (nothing can take it back): it may still
   * commit, so what it recorded must not be relied on by either side (see {@link forgetRefused}).
   */
  private async within<T>(done: Promise<T>): Promise<T> {
    const ms = this.options.commitTimeoutMs ?? COMMIT_TIMEOUT_MS;
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new CommitTimedOut(`journal commit did not complete in ${ms / 1000} s at ${join(this.options.dir, 'data.mdb')}`)), ms);
    });
    try {
      return await Promise.race([done, timedOut]);
    } catch (err) {
      if (err instanceof CommitTimedOut) {
        done.catch(() => undefined); // its late failure was reported by settled; nobody waits for it now
        this.commits.failed(err.message, err);
      }
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * A task refused because its commit did not complete in time ({@link within}): its record is still queued, and on
   * disk if that commit completes after all. Its removal is queued right behind it (writes commit in order), so a
   * restart never runs a task its client was told was refused. Only that acceptance's record (by its `acceptedAt`): a
   * re-submit of the id accepted since is left alone. What is left is the window of one commit: a crash after the
   * late commit and before the next one.
   */
  private forgetRefused(taskId: string, acceptedAt: number): void {
    this.write(
      this.db.transaction(() => {
        const record = this.read(keys.task(taskId)) as Partial<TaskRecord> | null | undefined;
        if (record?.acceptedAt !== acceptedAt) return;
        void this.db.remove(keys.task(taskId));
        for (const range of keys.ofTask(taskId)) for (const k of this.db.getKeys(range)) void this.db.remove(k);
      }),
      'removal of a task refused when its commit did not complete',
    );
  }

  /**
   * A write's promise, rejecting with the real cause when its transaction failed. lmdb-js rejects each write of a
   * failed commit with a generic error whose `commitError` is a second promise holding the cause (ENOSPC, or EIO:
   * LMDB reports a short write as EIO, which is how a full disk usually shows); that promise must be handled, or
   * its rejection would end the process.
   */
  private async settled<T>(done: Promise<T>): Promise<T> {
    let result: T;
    try {
      result = await done;
    } catch (err) {
      const commitError = (err as { commitError?: Promise<unknown> } | undefined)?.commitError;
      const cause = !commitError
        ? err
        : await commitError.then(
            () => err,
            (c: unknown) => c,
          );
      // Nothing of this transaction is on disk: the journal cannot commit until one succeeds (health says so).
      this.commits.failed(`journal write failed: ${this.failureLine(cause)}`, cause);
      throw cause;
    }
    this.commits.succeeded();
    if (this.diskFull) {
      // A commit wrote pages again (the probe's, an ack's): the disk has room. Past the soft bound it stays full, now
      // the bound's to clear (compaction).
      this.diskFull = false;
      if (this.usedBytes() < this.options.maxBytes) this.clearFull();
    }
    return result;
  }

  /** Bytes left to an unprivileged writer on the journal's file system (undefined if it cannot be asked). */
  private async freeBytes(): Promise<number | undefined> {
    try {
      const fs = await statfs(this.options.dir);
      return fs.bavail * fs.bsize;
    } catch {
      return undefined;
    }
  }
}

/**
 * Why `dir` cannot be made the journal's directory when mkdir failed with EEXIST (it is a file) or ENOTDIR (a parent
 * is): failed_precondition naming journal.dir and the file in the way, rather than Node's bare errno. Undefined for
 * any other failure.
 */
function notADirectory(err: unknown, dir: string): RolloutError | undefined {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'EEXIST') {
    return new RolloutError('failed_precondition', `journal.dir: ${dir} is a file, not a directory: give journal.dir a directory (it is created if missing)`, { field: 'journal.dir', cause: err });
  }
  if (code !== 'ENOTDIR') return undefined;
  // The nearest ancestor that exists is the one in the way.
  let blocking = dirname(resolve(dir));
  while (!existsSync(blocking) && dirname(blocking) !== blocking) blocking = dirname(blocking);
  return new RolloutError('failed_precondition', `journal.dir: cannot create ${dir}: ${blocking} is a file, not a directory`, { field: 'journal.dir', cause: err });
}

/** A failed write on a file system with less room than this is a full disk (LMDB reports a short write as EIO). */
const NEARLY_FULL_BYTES = 4 << 20;

/**
 * Why a journal could not be opened, as failed_precondition naming journal.dir and what to do, for the causes an
 * operator can act on: LMDB's report of a damaged page, a full file system (start-up writes its lock file, and stamps
 * or cleans the journal: nothing of what it holds is lost by waiting for room). Anything else as it is (app.ts
 * names the directory).
 */
function cannotOpen(err: unknown, dir: string): unknown {
  if (err instanceof RolloutError) return err;
  if (isDamaged(err)) {
    const file = join(dir, 'data.mdb');
    return new RolloutError('failed_precondition', `journal.dir: ${file} is damaged (LMDB: ${errorText(err).split('\n')[0]}); ${damagedAdvice(dir)}`, { field: 'journal.dir', cause: err });
  }
  if (isFull(err)) {
    return new RolloutError('failed_precondition', `journal.dir: the file system of ${dir} is full (${writeFailureText(err)}): the journal cannot be opened; free space on it and start again (what the journal holds is kept)`, { field: 'journal.dir', cause: err });
  }
  return err;
}
