import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { open } from 'lmdb';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { DirLock, LOCK_HEARTBEAT_MS, LOCK_STALE_MS } from '../../src/journal/dir-lock.js';
import { Journal } from '../../src/journal/journal.js';
import { silentLogger } from '../../src/observability/logger.js';

const dirs: string[] = [];
async function freshDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'rollout-journal-integrity-'));
  dirs.push(dir);
  return dir;
}
afterEach(async () => {
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

const bytes = (n: number, fill = 7): Uint8Array => new Uint8Array(n).fill(fill);
const opened = (dir: string): ReturnType<typeof Journal.open> => Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });

/** Edits the store behind a closed journal directly (what a hand edit, a partial write or a kill -9 leaves). */
async function edit(dir: string, change: (db: ReturnType<typeof open>) => void): Promise<void> {
  const db = open({ path: dir, compression: false });
  change(db);
  await db.close();
}

describe('the journal on damaged or shared directories', () => {
  it('stamps a new journal with its format version and refuses one with a higher version (failed_precondition naming journal.dir)', async () => {
    const dir = await freshDir();
    await opened(dir).journal.close();
    await edit(dir, (db) => {
      expect(db.get(['v'])).toBe(1);
      db.putSync(['v'], 2);
    });
    expect(() => opened(dir)).toThrow(expect.objectContaining({ code: 'failed_precondition', message: expect.stringMatching(/^journal\.dir: .*format version 2/) }));
    // The refusal released the directory: with the version back, it opens.
    await edit(dir, (db) => db.putSync(['v'], 1));
    await opened(dir).journal.close();
  });

  it('moves a record that cannot be read to the quarantine range [x, ...key], with its results and acks, and loads the rest', async () => {
    const dir = await freshDir();
    const { journal } = opened(dir);
    await journal.accepted('good', bytes(10), 1, '');
    await journal.accepted('bad', bytes(10), 2, '');
    await journal.finished('bad', 0, bytes(5));
    await journal.close();
    await edit(dir, (db) => db.putSync(['t', 'bad'], { v: 9, payload: 'another shape' }));
    const again = opened(dir);
    expect(again.contents.tasks.map((t) => t.taskId)).toEqual(['good']);
    expect(again.contents.quarantined).toBe(1);
    await again.journal.close();
    await edit(dir, (db) => {
      expect(db.get(['t', 'bad'])).toBeUndefined();
      expect(db.get(['r', 'bad', 0])).toBeUndefined();
      expect(db.get(['x', 't', 'bad'])).toBeInstanceOf(Uint8Array); // kept, as its stored bytes
      expect(db.get(['x', 'r', 'bad', 0])).toBeInstanceOf(Uint8Array);
    });
  });

  it('keeps what a lost task owes each live session across reopens until that session acks it, ends, or is opened again without resume', async () => {
    const dir = await freshDir();
    const { journal } = opened(dir);
    for (const s of ['acks', 'ends', 'reused', 'whole']) journal.sessionOpened(s);
    await journal.accepted('lost', bytes(10), 2, 'acks');
    for (const s of ['ends', 'reused', 'whole']) await journal.owed('lost', s);
    await journal.finished('lost', 1, bytes(5));
    journal.ack({ taskIds: [], trajectories: [{ taskId: 'lost', sampleIndex: 1 }] }, 'acks');
    await journal.close();
    // Its record unreadable (its sample count damaged): quarantined at open, its sessions owed its loss.
    await edit(dir, (db) => db.putSync(['t', 'lost'], { ...(db.get(['t', 'lost']) as object), numSamples: 'two' }));
    const debts = (j: Journal): string[] => j.owedLost().map((d) => `${d.session} ${d.taskId}/${d.numSamples} acked ${[...d.acked].join(',')}`).sort();
    const second = opened(dir);
    expect(debts(second.journal)).toEqual(['acks lost/2 acked 1', 'ends lost/2 acked ', 'reused lost/2 acked ', 'whole lost/2 acked ']);
    expect(second.journal.owedLost()[0]!.error).toMatch(/record of task "lost" could not be read/);
    second.journal.ack({ taskIds: [], trajectories: [{ taskId: 'lost', sampleIndex: 0 }] }, 'acks'); // its last
    second.journal.ack({ taskIds: ['lost'], trajectories: [] }, 'whole');
    second.journal.sessionEnded('ends');
    second.journal.sessionOpened('reused');
    await second.journal.close();
    const third = opened(dir);
    expect(debts(third.journal)).toEqual([]);
    await third.journal.close();
    await edit(dir, (db) => expect([...db.getKeys({ start: ['l'], end: ['l', '\uffff'] })]).toEqual([]));
  });

  it('removes results and acks without their task at open, and before accepting a task with that id', async () => {
    const dir = await freshDir();
    await opened(dir).journal.close();
    await edit(dir, (db) => {
      db.putSync(['r', 'gone', 0], bytes(5));
      db.putSync(['a', 'gone', 0], 1);
    });
    const { journal, contents } = opened(dir);
    expect(contents.tasks).toEqual([]);
    // A leftover written while it is open (what a compaction cut short would leave before the next accept).
    const db = (journal as unknown as { db: ReturnType<typeof open> }).db;
    await db.put(['r', 'again', 0], bytes(5));
    await journal.accepted('again', bytes(10), 1, '');
    await journal.close();
    const reopened = opened(dir);
    expect(reopened.contents.tasks.map((t) => [t.taskId, t.finished.size, t.acked.size])).toEqual([['again', 0, 0]]);
    await reopened.journal.close();
    await edit(dir, (raw) => expect(raw.get(['r', 'gone', 0])).toBeUndefined());
  });

  it('removes owner records left without their task or by an earlier acceptance of the id, and quarantines an unreadable one', async () => {
    const dir = await freshDir();
    const { journal } = opened(dir);
    await journal.accepted('kept', bytes(10), 1, 'first');
    await journal.owed('kept', 'second');
    await journal.accepted('reused', bytes(10), 1, 'first');
    await journal.close();
    let acceptedAt = 0;
    await edit(dir, (db) => {
      acceptedAt = (db.get(['t', 'reused']) as { acceptedAt: number }).acceptedAt;
      // What an older server leaves (it compacts without knowing owner records), or a compaction cut short.
      db.putSync(['o', 'gone', 'second'], { taskAcceptedAt: 1, at: 1 });
      db.putSync(['o', 'gone', 'second', 0], 1);
      db.putSync(['o', 'reused', 'second'], { taskAcceptedAt: acceptedAt - 1, at: 1 }); // an earlier 'reused'
      db.putSync(['o', 'reused', 'second', 0], 1);
      db.putSync(['o', 'kept', 'garbled'], 'not an owner record');
      db.putSync(['o', 'kept', 'garbled', 0], 1);
    });
    const again = opened(dir);
    // The unreadable one's key still names its session: the task stays owed to it (its value moved aside, its ack kept).
    expect(again.contents.tasks.map((t) => [t.taskId, [...t.owners].map(([s, acked]) => [s, [...acked]])])).toEqual([
      ['kept', [['garbled', [0]], ['second', []]]],
      ['reused', []],
    ]);
    expect(again.contents.quarantined).toBe(1);
    await again.journal.close();
    await edit(dir, (db) => {
      expect([...db.getKeys({ start: ['o'], end: ['o', '\uffff'] })]).toEqual([['o', 'kept', 'garbled'], ['o', 'kept', 'garbled', 0], ['o', 'kept', 'second']]);
      expect(db.get(['x', 'o', 'kept', 'garbled'])).toBeInstanceOf(Uint8Array); // its bytes kept aside
      expect(db.get(['o', 'kept', 'garbled'])).toMatchObject({ taskAcceptedAt: expect.any(Number) });
    });
  });

  it('opens a journal written before owner records existed as it was: each task owed to its session, its acks that session\u2019s', async () => {
    const dir = await freshDir();
    await edit(dir, (db) => {
      // The records a server of that version wrote (format version 1, no owner records).
      db.putSync(['v'], 1);
      db.putSync(['s', 'first'], { openedAt: 1 });
      db.putSync(['t', 'old'], { spec: bytes(10), numSamples: 2, session: 'first', acceptedAt: 5 });
      db.putSync(['r', 'old', 0], bytes(5));
      db.putSync(['r', 'old', 1], bytes(5));
      db.putSync(['a', 'old', 1], 1);
    });
    const { journal, contents } = opened(dir);
    expect(contents.tasks.map((t) => [t.taskId, t.session, [...t.finished.keys()], [...t.acked], t.owners.size])).toEqual([['old', 'first', [0, 1], [1], 0]]);
    expect(await journal.compact()).toBe(0); // 'first' has not acked sample 0
    journal.ack({ taskIds: ['old'], trajectories: [] }, 'first');
    expect(await journal.compact()).toBe(1);
    await journal.close();
    await edit(dir, (db) => expect(db.get(['v'])).toBe(1));
  });

  it('is held by one journal at a time (failed_precondition naming journal.dir and the holder); a dead holder’s lock is taken over', async () => {
    const dir = await freshDir();
    const first = opened(dir);
    expect(() => opened(dir)).toThrow(expect.objectContaining({ code: 'failed_precondition', message: expect.stringMatching(/journal\.dir: .* is in use by another server \(this process, pid \d+\)/) }));
    await first.journal.close();
    // What a kill -9 leaves: the lock file of a process that no longer runs (pid 2^22 + 1 is above Linux's pid_max).
    writeFileSync(join(dir, 'server.lock'), JSON.stringify({ pid: 4_194_305, host: (await import('node:os')).hostname(), startedAt: 'then' }));
    await opened(dir).journal.close();
    // A holder on another host cannot be asked: its lock is fresh while its file is touched (heartbeat) — refused —
    // and stale once untouched for LOCK_STALE_MS (a server gone with its node): taken over.
    const lock = join(dir, 'server.lock');
    writeFileSync(lock, JSON.stringify({ pid: 1, host: 'elsewhere', startedAt: 'then' }));
    expect(() => opened(dir)).toThrow(/pid 1 on host elsewhere, alive less than 60 s ago/);
    const past = new Date(Date.now() - LOCK_STALE_MS - 5_000);
    utimesSync(lock, past, past);
    const taken = opened(dir);
    expect(JSON.parse(readFileSync(lock, 'utf8'))).toMatchObject({ pid: process.pid });
    await taken.journal.close();
  });

  it('keeps its lock file fresh while it is held, so a server on another host does not take it over', () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval', 'Date'] });
    try {
      const dir = mkdtempSync(join(tmpdir(), 'dir-lock-'));
      const lock = DirLock.acquire(dir);
      const file = join(dir, 'server.lock');
      const old = new Date(Date.now() - LOCK_STALE_MS * 2);
      utimesSync(file, old, old);
      vi.advanceTimersByTime(LOCK_HEARTBEAT_MS);
      expect(Date.now() - statSync(file).mtimeMs).toBeLessThan(LOCK_HEARTBEAT_MS);
      lock.release();
      expect(existsSync(file)).toBe(false);
      rmSync(dir, { recursive: true, force: true });
    } finally {
      vi.useRealTimers();
    }
  });
});

describe('the journal bound against tasks retained for GetTrajectory', () => {
  it('past its bound, lets go of the oldest retained finished tasks (shed) and compacts them, instead of refusing for good', async () => {
    const dir = await freshDir();
    const retained: string[] = [];
    const shed = (): number => retained.splice(0, Math.max(1, Math.ceil(retained.length / 8))).length;
    const { journal } = Journal.open({ dir, maxBytes: 1 << 20, logger: silentLogger(), retained: (id) => retained.includes(id), shed });
    for (let i = 0; i < 200; i++) {
      await journal.accepted(`t${i}`, bytes(2_000), 1, '');
      await journal.finished(`t${i}`, 0, bytes(20_000));
      retained.push(`t${i}`);
    }
    expect(journal.usedBytes()).toBeLessThanOrEqual(1 << 20);
    expect(journal.taskCount).toBeLessThan(200);
    expect(retained).toContain('t199'); // the newest are kept
    await journal.close();
  });
});
