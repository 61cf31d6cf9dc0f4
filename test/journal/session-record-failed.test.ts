import type { RootDatabase } from 'lmdb';
import { describe, expect, it } from 'vitest';
import { mathTask } from '../support/harness.js';
import { journalSuite, owedOnResume } from '../support/journal-suite.js';

// A session's record is written when it opens, without an answer to wait for. If that write fails (a transient ENOSPC)
// and a task accepted on the session later commits, a crash must still find the session: the task is owed to it, and
// a trainer told NOT_FOUND on resume would never get its trajectories on a stream.

const suite = journalSuite();

describe('a session whose record the journal could not write when it opened', () => {
  it('is still resumable after a crash once a task accepted on it was journaled, and owed that task', async () => {
    const a = await suite.server(await suite.dir('journal-session-record-'), { engine: { tokenLatencyMs: 2_000 } });
    // The session record's write fails once, as lmdb-js reports ENOSPC.
    const db = (a.server.journal as unknown as { db: RootDatabase }).db;
    const put = db.put.bind(db);
    let failed = 0;
    db.put = ((key: unknown, ...rest: unknown[]) => {
      if (Array.isArray(key) && key[0] === 's' && failed === 0) {
        failed++;
        return Promise.reject(Object.assign(new Error('ENOSPC: no space left on device'), { code: 'ENOSPC' }));
      }
      return (put as (...args: unknown[]) => Promise<boolean>)(key, ...rest);
    }) as typeof db.put;
    const session = a.client.openSession({ sessionId: 'unlucky', autoAck: false });
    expect(await session.submit(mathTask('slow', 1, 71))).toMatchObject({ duplicate: false });
    expect(failed).toBe(1);
    const image = await suite.crashImage(a); // kill -9 while it runs

    const b = await suite.server(image);
    // Before the fix: NOT_FOUND (the session was unknown, though the journal held a task accepted on it).
    const { trajectories } = await owedOnResume(b, 'unlucky');
    expect(trajectories.map((t) => `${t.taskId}#${t.sampleIndex}`)).toEqual(['slow#0']);
  }, 180_000);
});
