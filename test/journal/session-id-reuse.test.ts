import { describe, expect, it } from 'vitest';
import { mathTask } from '../support/harness.js';
import { journalSuite, owedOnResume as resumeAndTake } from '../support/journal-suite.js';
import { TrajectoryReader, type ServerHarness } from '../support/server-harness.js';

// Opening a session id again without `resume` starts a new, clean session (SessionManager.open replaces a detached
// one): what the earlier session was owed is forgotten. The journal must forget it too, or a crash brings the old
// session's unacked trajectories back to the new one, which never asked for them.

const suite = journalSuite();

const key = (t: { taskId: string; sampleIndex: number }): string => `${t.taskId}#${t.sampleIndex}`;

async function owedOnResume(h: ServerHarness, sessionId: string): Promise<string[]> {
  return (await resumeAndTake(h, sessionId)).trajectories.map(key).sort();
}

describe('a session id opened again without resume', () => {
  it('is owed nothing of the earlier session after a crash, as in memory', async () => {
    const a = await suite.server(await suite.dir('journal-session-reuse-'));
    const earlier = a.client.openSession({ sessionId: 'fixed-id', autoAck: false });
    await earlier.submit(mathTask('old', 1, 71));
    await earlier.submit(mathTask('old-shared', 1, 72));
    await new TrajectoryReader(earlier).take(2); // delivered, never acked
    earlier.abort();
    // A second session owes `old-shared` too (a duplicate on it): an owner record besides the task's own session.
    const other = a.client.openSession({ sessionId: 'other', autoAck: false });
    await other.submit(mathTask('old-shared', 1, 72));
    await new TrajectoryReader(other).take(1);
    other.abort();

    // The same id, opened fresh: a new session. It re-submits `old-shared` (a duplicate it is owed from now on).
    const fresh = a.client.openSession({ sessionId: 'fixed-id', autoAck: false });
    expect((await fresh.opened).redelivered).toBe(0);
    await fresh.submit(mathTask('new', 1, 73));
    expect(await fresh.submit(mathTask('old-shared', 1, 72))).toMatchObject({ duplicate: true, alreadyOwed: false });
    await new TrajectoryReader(fresh).take(2);
    fresh.abort();
    const image = await suite.crashImage(a);

    // In memory: only what the new session was sent.
    expect(await owedOnResume(a, 'fixed-id')).toEqual(['new#0', 'old-shared#0']);
    const b = await suite.server(image);
    // Before the fix: old#0 as well (the earlier session's debt, kept by the journal under the same id).
    expect(await owedOnResume(b, 'fixed-id')).toEqual(['new#0', 'old-shared#0']);
    expect(await owedOnResume(b, 'other')).toEqual(['old-shared#0']);
  }, 180_000);

  it('after the earlier session ended, its unacked tasks are not owed to the new one after a crash', async () => {
    const a = await suite.server(await suite.dir('journal-session-reuse-ended-'));
    const earlier = a.client.openSession({ sessionId: 'fixed-id', autoAck: false });
    await earlier.submit(mathTask('old', 1, 74));
    await new TrajectoryReader(earlier).take(1);
    earlier.abort();
    // It expires (what the sweeper does after the TTL), then the id is opened fresh.
    a.server.sessions.close(a.server.sessions.get('fixed-id')!);
    const fresh = a.client.openSession({ sessionId: 'fixed-id', autoAck: false });
    await fresh.submit(mathTask('new', 1, 75));
    await new TrajectoryReader(fresh).take(1);
    fresh.abort();
    const b = await suite.server(await suite.crashImage(a));
    expect(await owedOnResume(b, 'fixed-id')).toEqual(['new#0']);
  }, 180_000);
});
