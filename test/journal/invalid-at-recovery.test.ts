import { describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { journalSuite, owedOnResume as resumeAndTake } from '../support/journal-suite.js';
import type { ServerHarness } from '../support/server-harness.js';

const suite = journalSuite();

const key = (t: { taskId: string; sampleIndex: number }): string => `${t.taskId}#${t.sampleIndex}`;
const status = (t: { status: TrajectoryStatus }): string => TrajectoryStatus[t.status];

/** Resumes `sessionId` on `h` and takes everything it is owed; `key status`, sorted. */
async function owedOnResume(h: ServerHarness, sessionId: string): Promise<string[]> {
  return (await resumeAndTake(h, sessionId)).trajectories.map((t) => `${key(t)} ${status(t)}`).sort();
}

describe('a journaled task that no longer validates when the server comes back (a bound lowered, an environment gone)', () => {
  it('is kept like any finished task: GetTrajectory finds its INVALID_TASK trajectories, its session is owed them, a re-submit is its duplicate', async () => {
    // Slow tokens: the task is still running when the server is killed.
    const a = await suite.server(await suite.dir('journal-invalid-'), { engine: { tokenLatencyMs: 2_000 } });
    const session = a.client.openSession({ sessionId: 'trainer', autoAck: false });
    await session.submit(mathTask('too-wide', 3, 51));
    const image = await suite.crashImage(a); // kill -9 while it runs

    // Restarted with max_num_samples lowered below the task's num_samples: recovery ends it INVALID_TASK.
    const lowered = { maxNumSamples: 2 };
    const b = await suite.server(image, { config: lowered });
    // Before the fix: NOT_FOUND.
    const stored = await b.client.getTrajectory('too-wide', { wait: true, deadlineMs: 10_000 });
    expect(stored.pending).toBe(0);
    expect(stored.trajectories.map((t) => `${key(t)} ${status(t)}`)).toEqual([0, 1, 2].map((i) => `too-wide#${i} TRAJECTORY_STATUS_INVALID_TASK`));
    expect(stored.trajectories[0]!.error).toMatch(/after a server restart the task could not be run again: .*num_samples/);
    // Before the fix: refused INVALID_ARGUMENT (num_samples), as if the task were new.
    expect((await b.client.submit(mathTask('too-wide', 3, 51))).duplicate).toBe(true);
    // The same id with another spec is still refused as a reuse, or by validation.
    await expect(b.client.submit(mathTask('too-wide', 3, 52))).rejects.toMatchObject({ details: expect.stringMatching(/num_samples|different spec/) });

    // Its session is owed them; a new session re-submitting it is a duplicate owed them too, also after a crash.
    const other = b.client.openSession({ sessionId: 'other', autoAck: false });
    expect(await other.submit(mathTask('too-wide', 3, 51))).toMatchObject({ duplicate: true, alreadyOwed: false });
    const image2 = await suite.crashImage(b);
    expect(await owedOnResume(b, 'trainer')).toEqual([0, 1, 2].map((i) => `too-wide#${i} TRAJECTORY_STATUS_INVALID_TASK`));

    const c = await suite.server(image2, { config: lowered });
    expect(await owedOnResume(c, 'other')).toEqual([0, 1, 2].map((i) => `too-wide#${i} TRAJECTORY_STATUS_INVALID_TASK`));
    expect(await owedOnResume(c, 'trainer')).toEqual([0, 1, 2].map((i) => `too-wide#${i} TRAJECTORY_STATUS_INVALID_TASK`));
  }, 180_000);
});

describe('a task recovered unrunnable, then let go by the task store (retention) while the journal still owes it', () => {
  it('is re-submitted as its duplicate, answered from the journal (not refused as a new invalid task); once the journal lets go of it too, it is a new task', async () => {
    const a = await suite.server(await suite.dir('journal-invalid-evicted-'), { engine: { tokenLatencyMs: 2_000 } });
    const session = a.client.openSession({ sessionId: 'trainer', autoAck: false });
    await session.submit(mathTask('too-wide', 3, 51));
    const image = await suite.crashImage(a); // kill -9 while it runs

    // Restarted with max_num_samples lowered, retaining one finished task: the next finished task pushes it out.
    const config = { maxNumSamples: 2, retainFinishedTasks: 1 };
    const b = await suite.server(image, { config });
    await b.client.getTrajectory('too-wide', { wait: true, deadlineMs: 10_000 });
    await b.client.submit(mathTask('pusher', 1, 52));
    await b.client.getTrajectory('pusher', { wait: true, deadlineMs: 60_000 });
    await expect(b.client.getTrajectory('too-wide')).rejects.toMatchObject({ details: expect.stringMatching(/unknown task_id/) });

    // Before the fix: refused INVALID_ARGUMENT (num_samples), though `trainer` is still owed it.
    expect(await b.client.submit(mathTask('too-wide', 3, 51))).toMatchObject({ duplicate: true });
    const stored = await b.client.getTrajectory('too-wide');
    expect(stored.trajectories.map((t) => `${key(t)} ${status(t)}`)).toEqual([0, 1, 2].map((i) => `too-wide#${i} TRAJECTORY_STATUS_INVALID_TASK`));
    // Another spec under its id is still refused.
    await expect(b.client.submit(mathTask('too-wide', 3, 53))).rejects.toMatchObject({ details: expect.stringMatching(/num_samples|different spec/) });
    // On a new session: a duplicate owed its trajectories, also after a crash.
    const other = b.client.openSession({ sessionId: 'other', autoAck: false });
    expect(await other.submit(mathTask('too-wide', 3, 51))).toMatchObject({ duplicate: true, alreadyOwed: false });
    const image2 = await suite.crashImage(b);
    expect(await owedOnResume(b, 'other')).toEqual([0, 1, 2].map((i) => `too-wide#${i} TRAJECTORY_STATUS_INVALID_TASK`));
    expect(await owedOnResume(b, 'trainer')).toEqual([0, 1, 2].map((i) => `too-wide#${i} TRAJECTORY_STATUS_INVALID_TASK`));
    const c = await suite.server(image2, { config });
    expect(await owedOnResume(c, 'other')).toEqual([0, 1, 2].map((i) => `too-wide#${i} TRAJECTORY_STATUS_INVALID_TASK`));

    // On b both sessions have acked everything and closed: once the store and the journal let go of it, nothing is
    // held, and the spec is a new task (refused by validation, as it does not fit this server).
    await b.client.submit(mathTask('pusher-2', 1, 54));
    await b.client.getTrajectory('pusher-2', { wait: true, deadlineMs: 60_000 });
    await b.server.journal!.compact();
    await expect(b.client.submit(mathTask('too-wide', 3, 51))).rejects.toMatchObject({ details: expect.stringMatching(/num_samples/) });
  }, 180_000);
});
