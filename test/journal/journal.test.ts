import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { open } from 'lmdb';
import { afterEach, describe, expect, it } from 'vitest';
import { Journal } from '../../src/journal/journal.js';
import { RolloutError } from '../../src/errors.js';
import { silentLogger } from '../../src/observability/logger.js';

const dirs: string[] = [];
async function freshDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'rollout-journal-'));
  dirs.push(dir);
  return dir;
}
afterEach(async () => {
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

const bytes = (n: number, fill = 7): Uint8Array => new Uint8Array(n).fill(fill);

describe('the journal', () => {
  it('gives back, after reopening, the sessions, accepted tasks (spec bytes, session), finished trajectories and acks it recorded', async () => {
    const dir = await freshDir();
    const { journal, contents } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    expect(contents).toEqual({ sessions: [], tasks: [], quarantined: 0 });
    journal.sessionOpened('s1');
    await journal.accepted('a', bytes(10, 1), 2, 's1');
    await journal.accepted('b', bytes(20, 2), 1, '');
    await journal.finished('a', 1, bytes(30, 3));
    await journal.finished('b', 0, bytes(40, 4));
    journal.ack({ taskIds: [], trajectories: [{ taskId: 'a', sampleIndex: 1 }, { taskId: 'a', sampleIndex: 0 }] }, 's1');
    await journal.close();

    const reopened = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    expect(reopened.contents.sessions).toEqual(['s1']);
    const [a, b] = reopened.contents.tasks;
    expect(a).toMatchObject({ taskId: 'a', numSamples: 2, session: 's1', spec: bytes(10, 1) });
    expect([...a!.finished]).toEqual([[1, bytes(30, 3)]]);
    // Only a finished sample can be acked: the ack of sample 0 (not finished) was not recorded.
    expect([...a!.acked]).toEqual([1]);
    expect(b).toMatchObject({ taskId: 'b', numSamples: 1, session: '' });
    expect([...b!.finished]).toEqual([[0, bytes(40, 4)]]);
    await reopened.journal.close();
  });

  it('acks a whole task as every sample finished so far', async () => {
    const dir = await freshDir();
    const { journal } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    journal.sessionOpened('s');
    await journal.accepted('t', bytes(4), 3, 's');
    await journal.finished('t', 0, bytes(4));
    await journal.finished('t', 2, bytes(4));
    journal.ack({ taskIds: ['t'], trajectories: [] }, 's');
    await journal.close();
    const { journal: again, contents } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    expect([...contents.tasks[0]!.acked].sort()).toEqual([0, 2]);
    await again.close();
  });

  it('compaction drops finished tasks that are acked (or whose session ended) and no longer retained, and keeps the rest', async () => {
    const dir = await freshDir();
    const retained = new Set(['kept-in-memory']);
    const { journal } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger(), retained: (id) => retained.has(id) });
    journal.sessionOpened('s');
    journal.sessionOpened('gone');
    const finish = async (id: string, session: string, ack: boolean): Promise<void> => {
      await journal.accepted(id, bytes(8), 1, session);
      await journal.finished(id, 0, bytes(8));
      if (ack) journal.ack({ taskIds: [id], trajectories: [] }, session);
    };
    await finish('acked', 's', true);
    await finish('unacked', 's', false);
    await finish('kept-in-memory', 's', true);
    await finish('unary', '', false);
    await finish('of-ended-session', 'gone', false);
    await journal.accepted('running', bytes(8), 2, 's');
    journal.sessionEnded('gone');
    expect(await journal.compact()).toBe(3);
    await journal.close();
    const { journal: again, contents } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    expect(contents.sessions).toEqual(['s']);
    expect(contents.tasks.map((t) => t.taskId).sort()).toEqual(['kept-in-memory', 'running', 'unacked']);
    await again.close();
  });

  it('owes a task to every session recorded as owed it, each ack settling the debt of the session that sent it only, across a reopen', async () => {
    const dir = await freshDir();
    const { journal } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    for (const s of ['first', 'second', 'stranger']) journal.sessionOpened(s);
    await journal.accepted('t', bytes(4), 2, 'first');
    await journal.finished('t', 0, bytes(4));
    await journal.finished('t', 1, bytes(4));
    await journal.owed('t', 'second');
    journal.ack({ taskIds: [], trajectories: [{ taskId: 't', sampleIndex: 0 }] }, 'second');
    journal.ack({ taskIds: ['t'], trajectories: [] }, 'stranger'); // not owed it: settles nothing
    journal.ack({ taskIds: [], trajectories: [{ taskId: 't', sampleIndex: 1 }] }, 'first');
    await journal.close();

    const reopened = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    const [t] = reopened.contents.tasks;
    expect([...t!.acked]).toEqual([1]);
    expect([...t!.owners].map(([s, acked]) => [s, [...acked]])).toEqual([['second', [0]]]);
    // Owed again (re-submitted after acking): every sample, whatever that session had acked; the others' acks stand.
    await reopened.journal.owed('t', 'second');
    await reopened.journal.owed('t', 'first');
    await reopened.journal.close();
    const again = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    expect([...again.contents.tasks[0]!.acked]).toEqual([]);
    expect([...again.contents.tasks[0]!.owners].map(([s, acked]) => [s, [...acked]])).toEqual([['second', []]]);
    await expect(again.journal.owed('unknown', 'second')).rejects.toMatchObject({ code: 'unavailable' });
    await again.journal.close();
  });

  it('answers a second owed() of the same session and task only once the first one’s write is on disk', async () => {
    const dir = await freshDir();
    const { journal } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    await journal.accepted('t', bytes(4), 1, 'first');
    // The owner record's commit is held (a slow disk).
    const db = (journal as unknown as { db: { transaction: (cb: () => unknown) => Promise<unknown> } }).db;
    const transaction = db.transaction.bind(db);
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    db.transaction = async (cb) => {
      await held;
      return transaction(cb);
    };
    const settled: string[] = [];
    const first = journal.owed('t', 'second').then(() => settled.push('first'));
    const second = journal.owed('t', 'second').then(() => settled.push('second'));
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(settled).toEqual([]);
    release();
    await Promise.all([first, second]);
    expect(settled.sort()).toEqual(['first', 'second']);
    await journal.close();
  });

  it('compaction keeps a task owed to several sessions until every live one acked it, and drops its owners with it', async () => {
    const dir = await freshDir();
    const { journal } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    for (const s of ['first', 'second', 'third']) journal.sessionOpened(s);
    await journal.accepted('t', bytes(8), 1, 'first');
    await journal.finished('t', 0, bytes(8));
    await journal.owed('t', 'second');
    await journal.owed('t', 'third');
    journal.ack({ taskIds: ['t'], trajectories: [] }, 'first');
    expect(await journal.compact()).toBe(0); // second and third still owed it
    journal.ack({ taskIds: ['t'], trajectories: [] }, 'second');
    expect(await journal.compact()).toBe(0);
    journal.sessionEnded('third'); // closed or expired: nothing of it can be resumed
    expect(await journal.compact()).toBe(1);
    await journal.close();
    const { journal: again, contents } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    expect(contents.tasks).toEqual([]);
    await again.close();
    const raw = open({ path: dir, compression: false });
    expect([...raw.getKeys()].filter((k) => ['t', 'r', 'a', 'o'].includes((k as string[])[0]!))).toEqual([]);
    await raw.close();
  });

  it('past its size bound (after compaction) refuses a task with RESOURCE_EXHAUSTED naming the journal, and accepts again once compaction frees room', async () => {
    const dir = await freshDir();
    const reasons: (string | undefined)[] = [];
    const { journal } = Journal.open({ dir, maxBytes: 1 << 20, logger: silentLogger() });
    journal.onFullChange = (reason) => reasons.push(reason);
    let accepted = 0;
    let refused: unknown;
    for (let i = 0; i < 100 && !refused; i++) {
      try {
        await journal.accepted(`t${i}`, bytes(64 << 10), 1, '');
        accepted++;
      } catch (err) {
        refused = err;
      }
    }
    expect(accepted).toBeGreaterThan(5);
    expect(refused).toBeInstanceOf(RolloutError);
    expect((refused as RolloutError).code).toBe('resource_exhausted');
    expect((refused as RolloutError).message).toMatch(/journal is full: .*journal\.maxBytes/);
    expect(journal.fullReason).toMatch(/journal is full/);
    expect(reasons).toHaveLength(1);
    // The tasks finish (nobody acks unary tasks; nothing retains them): compaction can drop them.
    for (let i = 0; i < accepted; i++) await journal.finished(`t${i}`, 0, bytes(16));
    await journal.accepted('after', bytes(64 << 10), 1, '');
    expect(journal.fullReason).toBeUndefined();
    expect(reasons).toEqual([expect.stringMatching(/journal is full/), undefined]);
    expect(journal.taskCount).toBe(1);
    await journal.close();
  });
});
