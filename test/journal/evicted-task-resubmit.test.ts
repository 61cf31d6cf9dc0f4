import { describe, expect, it } from 'vitest';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { journalSuite, owedOnResume as resumeAndTake } from '../support/journal-suite.js';
import { TrajectoryReader, type ServerHarness } from '../support/server-harness.js';

// The task store lets go of finished tasks (retention, or the journal's bound shedding them) while the journal may
// still owe them to a session that has not acked. A re-submit of such a task id must be its duplicate (the journal
// still holds its spec and trajectories), never a new acceptance that overwrites the journal's record and with it the
// other sessions' debts.

const suite = journalSuite();

const key = (t: { taskId: string; sampleIndex: number }): string => `${t.taskId}#${t.sampleIndex}`;

async function owedOnResume(h: ServerHarness, sessionId: string): Promise<string[]> {
  return (await resumeAndTake(h, sessionId)).trajectories.map(key).sort();
}

/** A server retaining one finished task, where `first` received `evicted` (not acked) and the store let it go. */
async function evictedButOwed(prefix: string): Promise<{ a: ServerHarness; received: Trajectory }> {
  const a = await suite.server(await suite.dir(prefix), { config: { retainFinishedTasks: 1 } });
  const first = a.client.openSession({ sessionId: 'first', autoAck: false });
  await first.submit(mathTask('evicted', 1, 61));
  const [received] = await new TrajectoryReader(first).take(1);
  first.abort(); // the trainer dies before its ack: the session stays resumable, owed `evicted`
  await a.client.submit(mathTask('pusher', 1, 62));
  await a.client.getTrajectory('pusher', { wait: true, deadlineMs: 60_000 });
  // Retention (1 task) let go of `evicted`: GetTrajectory no longer finds it.
  await expect(a.client.getTrajectory('evicted')).rejects.toMatchObject({ details: expect.stringMatching(/unknown task_id/) });
  return { a, received: received! };
}

describe('a task let go by the task store while the journal still owes it to a session, then re-submitted', () => {
  it('is a duplicate on another session: it gets the same trajectory, and after a crash both sessions are owed it', async () => {
    const { a, received } = await evictedButOwed('journal-evicted-');
    const second = a.client.openSession({ sessionId: 'second', autoAck: false });
    // Before the fix: accepted anew (duplicate false), run again, and `first`'s debt overwritten in the journal.
    expect(await second.submit(mathTask('evicted', 1, 61))).toMatchObject({ duplicate: true, alreadyOwed: false });
    const [again] = await new TrajectoryReader(second).take(1);
    expect(again).toEqual(received);
    const image = await suite.crashImage(a);

    const b = await suite.server(image, { config: { retainFinishedTasks: 1 } });
    expect(await owedOnResume(b, 'first')).toEqual(['evicted#0']);
    expect(await owedOnResume(b, 'second')).toEqual(['evicted#0']);
  }, 180_000);

  it('is a duplicate for the unary Submit too (GetTrajectory finds it again), and another spec under its id is refused', async () => {
    const { a, received } = await evictedButOwed('journal-evicted-unary-');
    expect(await a.client.submit(mathTask('evicted', 1, 61))).toMatchObject({ duplicate: true });
    const stored = await a.client.getTrajectory('evicted');
    expect(stored.trajectories).toEqual([received]);
    await expect(a.client.submit(mathTask('evicted', 1, 63))).rejects.toMatchObject({ details: expect.stringMatching(/different spec/) });
    const image = await suite.crashImage(a);
    const b = await suite.server(image, { config: { retainFinishedTasks: 1 } });
    expect(await owedOnResume(b, 'first')).toEqual(['evicted#0']);
  }, 180_000);
});
