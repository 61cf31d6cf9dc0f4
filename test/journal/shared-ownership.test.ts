import type { RootDatabase } from 'lmdb';
import { status } from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { TaskRejectedError } from '../../src/client/rollout-client.js';
import { mathTask } from '../support/harness.js';
import { journalSuite, owedOnResume as resumeAndTake } from '../support/journal-suite.js';
import { TrajectoryReader, type ServerHarness } from '../support/server-harness.js';

// A task answered `accepted` (duplicate) on a session that did not hold it — a restarted trainer re-submitting under
// a new session id, a stream re-submitting a unary task, a session re-submitting a task it had acked in full — is sent
// every trajectory of that task from then on. The journal must owe it the same after a crash, or the trainer waits
// forever for trajectories the server no longer knows it owes.

const suite = journalSuite();

const key = (t: { taskId: string; sampleIndex: number }): string => `${t.taskId}#${t.sampleIndex}`;
const refs = (ts: Trajectory[]): { taskId: string; sampleIndex: number }[] => ts.map((t) => ({ taskId: t.taskId, sampleIndex: t.sampleIndex }));

/** Resumes `sessionId` on `h` and takes everything it is owed (acking it as it comes); the keys, sorted. */
async function owedOnResume(h: ServerHarness, sessionId: string): Promise<{ announced: number; keys: string[] }> {
  const { opened, trajectories } = await resumeAndTake(h, sessionId);
  return { announced: opened.redelivered + opened.pending, keys: trajectories.map(key).sort() };
}

describe('a task re-submitted under a new session id while still owed to the first (a restarted trainer)', () => {
  it('is owed to both sessions after a crash, each settling its own debt by its acks', async () => {
    const a = await suite.server(await suite.dir('journal-owners-'));
    const run1 = a.client.openSession({ sessionId: 'trainer-run-1', autoAck: false });
    await run1.submit(mathTask('shared', 2, 11));
    await new TrajectoryReader(run1).take(2); // finished and delivered, not acked
    run1.abort(); // the trainer dies: its session stays resumable, owing both

    const run2 = a.client.openSession({ sessionId: 'trainer-run-2', autoAck: false });
    expect(await run2.submit(mathTask('shared', 2, 11))).toMatchObject({ duplicate: true, alreadyOwed: false });
    const reader2 = new TrajectoryReader(run2);
    expect((await reader2.take(2)).map(key).sort()).toEqual(['shared#0', 'shared#1']); // owed in memory
    const beforeAck = await suite.crashImage(a); // kill -9 here

    // run-2 acks; a fence's `accepted` proves the acks are on disk (one stream is journaled in order).
    run2.ack(refs(reader2.received));
    await run2.submit(mathTask('fence', 1, 12));
    const afterAck = await suite.crashImage(a); // or here

    const b = await suite.server(beforeAck);
    // Before the fix: run-2 was owed nothing (announced 0), its trainer waiting for `shared` forever.
    expect(await owedOnResume(b, 'trainer-run-2')).toEqual({ announced: 2, keys: ['shared#0', 'shared#1'] });
    expect(await owedOnResume(b, 'trainer-run-1')).toEqual({ announced: 2, keys: ['shared#0', 'shared#1'] });

    const c = await suite.server(afterAck);
    // run-2's ack settled run-2's debt only (before the fix it was recorded as the task's, and run-1 lost them).
    expect((await owedOnResume(c, 'trainer-run-2')).keys.filter((k) => k.startsWith('shared'))).toEqual([]);
    expect(await owedOnResume(c, 'trainer-run-1')).toEqual({ announced: 2, keys: ['shared#0', 'shared#1'] });
  }, 180_000);
});

describe('a task re-submitted by the session that had received and acked all of it', () => {
  it('is owed to it again after a crash, as the server re-sent it', async () => {
    const a = await suite.server(await suite.dir('journal-reowed-'));
    const session = a.client.openSession({ sessionId: 'epoch-loop', autoAck: false });
    const reader = new TrajectoryReader(session);
    await session.submit(mathTask('again', 2, 21));
    session.ack(refs(await reader.take(2))); // acked in full: the session forgets the task
    await session.submit(mathTask('fence', 1, 22));
    await reader.take(1);
    // Sent again (e.g. by a trainer that lost what it had received before it could use it): owed again, in memory ...
    expect(await session.submit(mathTask('again', 2, 21))).toMatchObject({ duplicate: true, alreadyOwed: false });
    expect((await reader.take(2)).map(key).sort()).toEqual(['again#0', 'again#1']);
    const image = await suite.crashImage(a);

    // ... and after the crash (before the fix: its old acks stood, and it was owed nothing).
    const b = await suite.server(image);
    expect((await owedOnResume(b, 'epoch-loop')).keys).toEqual(['again#0', 'again#1', 'fence#0']);
  }, 180_000);
});

describe('a task first submitted by the unary Submit, then on a stream', () => {
  it('is owed to the stream\u2019s session after a crash', async () => {
    const a = await suite.server(await suite.dir('journal-unary-owner-'));
    await a.client.submit(mathTask('unary-first', 1, 31));
    await a.client.getTrajectory('unary-first', { wait: true, deadlineMs: 60_000 });
    const session = a.client.openSession({ sessionId: 'streamer', autoAck: false });
    expect(await session.submit(mathTask('unary-first', 1, 31))).toMatchObject({ duplicate: true, alreadyOwed: false });
    await new TrajectoryReader(session).take(1);
    const image = await suite.crashImage(a);

    const b = await suite.server(image);
    expect(await owedOnResume(b, 'streamer')).toEqual({ announced: 1, keys: ['unary-first#0'] });
  }, 180_000);
});

describe('a duplicate whose debt the journal cannot record (a full disk)', () => {
  it('is refused as retryable with nothing delivered, and accepted on the retry', async () => {
    const a = await suite.server(await suite.dir('journal-owner-full-'));
    await a.client.submit(mathTask('busy', 1, 41));
    await a.client.getTrajectory('busy', { wait: true, deadlineMs: 60_000 });
    // The owner record's transaction fails once, as lmdb-js reports ENOSPC.
    const db = (a.server.journal as unknown as { db: RootDatabase }).db;
    const transaction = db.transaction.bind(db);
    let failed = 0;
    db.transaction = ((callback: () => unknown) => {
      if (failed++ === 0) return Promise.reject(Object.assign(new Error('ENOSPC: no space left on device'), { code: 'ENOSPC' }));
      return transaction(callback);
    }) as typeof db.transaction;
    const session = a.client.openSession({ sessionId: 'unlucky', autoAck: false, retryRejectedForMs: 0 });
    const refused = await session.submit(mathTask('busy', 1, 41)).catch((err: unknown) => err);
    expect(refused).toBeInstanceOf(TaskRejectedError);
    expect((refused as TaskRejectedError).code).toBe(status.RESOURCE_EXHAUSTED);
    expect((refused as TaskRejectedError).reason).toMatch(/disk is full/);
    const reader = new TrajectoryReader(session);
    expect(await session.submit(mathTask('busy', 1, 41))).toMatchObject({ duplicate: true, alreadyOwed: false });
    session.close();
    // Delivered once, after the accepted retry: the refused submit attached nothing.
    expect((await reader.rest()).map(key)).toEqual(['busy#0']);
    expect(a.server.journal!.fullReason).toBeUndefined();
  }, 120_000);
});
