import { open } from 'lmdb';
import { describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { journalSuite, owedOnResume as resumeAndTake } from '../support/journal-suite.js';
import { TrajectoryReader, type ServerHarness } from '../support/server-harness.js';

// A task record that cannot be read at start-up is moved to the quarantine range with its trajectories and acks. The
// sessions it was owed to must hear that it is lost (a failed trajectory per sample they had not acked, saying why),
// never wait for it forever.

const suite = journalSuite();

const line = (t: { taskId: string; sampleIndex: number; status: TrajectoryStatus }): string => `${t.taskId}#${t.sampleIndex} ${TrajectoryStatus[t.status]}`;

async function owedOnResume(h: ServerHarness, sessionId: string): Promise<{ lines: string[]; errors: string[] }> {
  const { trajectories } = await resumeAndTake(h, sessionId);
  return { lines: trajectories.map(line).sort(), errors: trajectories.filter((t) => t.taskId === 'victim').map((t) => t.error) };
}

/** `trainer` owes `victim` (2 samples, sample 1 acked) and `good`; `other` owes `victim` by a duplicate. */
async function journalWith(damage: (db: ReturnType<typeof open>) => void): Promise<string> {
  const dir = await suite.dir('journal-quarantined-debts-');
  const a = await suite.server(dir);
  const trainer = a.client.openSession({ sessionId: 'trainer', autoAck: false });
  await trainer.submit(mathTask('victim', 2, 81));
  await trainer.submit(mathTask('good', 1, 82));
  await new TrajectoryReader(trainer).take(3);
  trainer.ack([{ taskId: 'victim', sampleIndex: 1 }]);
  await trainer.submit(mathTask('fence', 1, 83)); // its acceptance proves the ack is on disk
  trainer.abort();
  const other = a.client.openSession({ sessionId: 'other', autoAck: false });
  await other.submit(mathTask('victim', 2, 81));
  await new TrajectoryReader(other).take(2);
  other.abort();
  await a.close();
  const db = open({ path: dir, compression: false });
  damage(db);
  await db.close();
  return dir;
}

const lostError = /journal's record of task "victim" could not be read/;

describe('a journaled task whose record is damaged, owed to sessions that had not acked it', () => {
  it('a spec that does not decode: each session is sent a failed trajectory for every sample it had not acked', async () => {
    const dir = await journalWith((db) => {
      const record = db.get(['t', 'victim']) as { spec: Uint8Array };
      db.putSync(['t', 'victim'], { ...record, spec: new Uint8Array([0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]) });
    });
    const b = await suite.server(dir);
    // Before the fix: nothing of victim (its sessions waited for it forever).
    const trainer = await owedOnResume(b, 'trainer');
    expect(trainer.lines).toEqual(['fence#0 TRAJECTORY_STATUS_COMPLETED', 'good#0 TRAJECTORY_STATUS_COMPLETED', 'victim#0 TRAJECTORY_STATUS_ENVIRONMENT_ERROR']);
    expect(trainer.errors).toEqual([expect.stringMatching(lostError)]);
    expect((await owedOnResume(b, 'other')).lines).toEqual(['victim#0 TRAJECTORY_STATUS_ENVIRONMENT_ERROR', 'victim#1 TRAJECTORY_STATUS_ENVIRONMENT_ERROR']);
    // The id is free again: the trainer may submit the task anew.
    expect((await b.client.submit(mathTask('victim', 2, 81))).duplicate).toBe(false);
  }, 180_000);

  it('a record of another shape: the sessions known from its owner records hear of it; the loss is counted', async () => {
    const dir = await journalWith((db) => {
      db.putSync(['t', 'victim'], { v: 2, payload: 'something newer' });
    });
    const b = await suite.server(dir);
    // `other` is known from its owner record; how many samples the task had is not, but it is known from the records
    // of its trajectories.
    expect((await owedOnResume(b, 'other')).lines).toEqual(['victim#0 TRAJECTORY_STATUS_ENVIRONMENT_ERROR', 'victim#1 TRAJECTORY_STATUS_ENVIRONMENT_ERROR']);
    expect(b.server.journal!.quarantined).toBeGreaterThan(0);
  }, 180_000);

  it('an owner record whose value does not decode: the session its key names is still owed the task', async () => {
    const dir = await journalWith((db) => {
      db.putSync(['o', 'victim', 'other'], 'not an owner record');
    });
    const b = await suite.server(dir);
    // Before the fix: quarantined with the debt it held, and `other` was owed nothing.
    expect((await owedOnResume(b, 'other')).lines).toEqual(['victim#0 TRAJECTORY_STATUS_COMPLETED', 'victim#1 TRAJECTORY_STATUS_COMPLETED']);
    expect(b.server.journal!.quarantined).toBe(1);
  }, 180_000);
});

describe('the failed trajectories told for a lost task, before their sessions ack them', () => {
  it('are journaled: a second crash still owes each session those it had not acked, and acks settle them for good', async () => {
    const dir = await journalWith((db) => {
      const record = db.get(['t', 'victim']) as { spec: Uint8Array };
      db.putSync(['t', 'victim'], { ...record, spec: new Uint8Array([0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]) });
    });
    const b = await suite.server(dir);
    // `other` takes both failed trajectories and acks one; a fence's `accepted` proves the ack is on disk.
    const other = b.client.openSession({ sessionId: 'other', resume: true, autoAck: false });
    const told = await new TrajectoryReader(other).take(2);
    expect(told.map(line).sort()).toEqual(['victim#0 TRAJECTORY_STATUS_ENVIRONMENT_ERROR', 'victim#1 TRAJECTORY_STATUS_ENVIRONMENT_ERROR']);
    other.ack([{ taskId: 'victim', sampleIndex: 0 }]);
    await other.submit(mathTask('fence-2', 1, 84));
    other.abort();
    // `trainer` never came back before this second crash.
    const image = await suite.crashImage(b);

    const c = await suite.server(image);
    // Before the fix: nothing of victim (the failed trajectories lived in memory only; the trainers wait forever).
    const trainer = await owedOnResume(c, 'trainer');
    expect(trainer.lines).toEqual(['fence#0 TRAJECTORY_STATUS_COMPLETED', 'good#0 TRAJECTORY_STATUS_COMPLETED', 'victim#0 TRAJECTORY_STATUS_ENVIRONMENT_ERROR']);
    expect(trainer.errors).toEqual([expect.stringMatching(lostError)]);
    expect((await owedOnResume(c, 'other')).lines).toEqual(['fence-2#0 TRAJECTORY_STATUS_COMPLETED', 'victim#1 TRAJECTORY_STATUS_ENVIRONMENT_ERROR']);
    // Its id is still free.
    expect((await c.client.submit(mathTask('victim', 2, 81))).duplicate).toBe(false);
    await c.client.getTrajectory('victim', { wait: true, deadlineMs: 60_000 });
    await c.close();

    // Both sessions took and acked everything and closed: nothing of the loss is kept, and a third start owes nothing.
    const db = open({ path: image, compression: false });
    const lostKeys = [...db.getKeys({ start: ['l'], end: ['l', '\uffff'] })];
    await db.close();
    expect(lostKeys).toEqual([]);
    const d = await suite.server(image);
    await expect(owedOnResume(d, 'trainer')).rejects.toThrow(/unknown or expired/);
  }, 180_000);
});
