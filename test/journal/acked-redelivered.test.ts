import { describe, expect, it } from 'vitest';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { journalSuite } from '../support/journal-suite.js';
import type { ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

const suite = journalSuite();

// A small per-session bound: the bound every trainer that acks once per step reaches (256 MiB by default).
const journaled = (dir: string): Promise<ServerHarness> => suite.server(dir, { config: { sessions: { maxUnackedBytes: 1 } } });

describe('a restart of a session whose journaled trajectories exceed its unacked-bytes bound', () => {
  it('never re-delivers a trajectory the session acked before the restart', async () => {
    const dir = await suite.dir('journal-acked-');
    const a = await journaled(dir);
    const session = a.client.openSession({ sessionId: 'acker', autoAck: false });
    const got: Trajectory[] = [];
    const reading = (async () => {
      try {
        for await (const t of session.trajectories()) {
          got.push(t);
          session.ack([{ taskId: t.taskId, sampleIndex: t.sampleIndex }]); // every trajectory acked as it arrives
        }
      } catch {
        // ends with the server
      }
    })();
    await session.submit(mathTask('grp', 3, 21));
    await eventually(() => got.filter((t) => t.taskId === 'grp').length === 3, 'the group, received and acked', 60_000);
    // A fence: its acceptance is fsynced after the acks of the group were written (README: "a task's accepted also
    // proves every ack sent before it on that stream is on disk").
    await session.submit(mathTask('fence', 1, 22));
    await a.close();
    await reading;

    const b = await journaled(dir);
    const resumed = b.client.openSession({ sessionId: 'acker', resume: true });
    await resumed.opened;
    resumed.close();
    const after: Trajectory[] = [];
    for await (const t of resumed.trajectories()) after.push(t);
    // README: a resumed session gets "exactly the trajectories of that session it had not acked ... and nothing it acked".
    expect(after.filter((t) => t.taskId === 'grp').map((t) => `${t.taskId}/${t.sampleIndex}`)).toEqual([]);
  }, 120_000);
});

describe('a whole-task ack while some of the task\u2019s trajectories are held (delivery paused)', () => {
  it('acks what was sent only: after a restart the held ones are still delivered, not lost', async () => {
    const dir = await suite.dir('journal-task-ack-');
    const a = await journaled(dir);
    const session = a.client.openSession({ sessionId: 'task-acker', autoAck: false });
    const got: Trajectory[] = [];
    const reading = (async () => {
      try {
        for await (const t of session.trajectories()) got.push(t);
      } catch {
        // ends with the server
      }
    })();
    await session.submit(mathTask('held-grp', 3, 31));
    // One unacked trajectory at a time (maxUnackedBytes 1): the first is sent, the other two finish and are held.
    // (The server holds the two before the client has necessarily read the first: both are waited for, not assumed.)
    await eventually(() => a.server.sessions.get('task-acker')?.heldCount === 2 && got.length >= 1, 'two held, the first received', 60_000);
    expect(got.map((t) => t.sampleIndex)).toHaveLength(1);
    session.ackTasks(['held-grp']);
    // The server has read the ack once it sends the next held one (room freed); a graceful shutdown then flushes
    // the journal's writes.
    await eventually(() => got.length === 2, 'the next held trajectory, sent once the ack freed room', 30_000);
    await a.close();
    await reading;

    const b = await journaled(dir);
    const resumed = b.client.openSession({ sessionId: 'task-acker', resume: true });
    await resumed.opened;
    resumed.close();
    const after: Trajectory[] = [];
    for await (const t of resumed.trajectories()) after.push(t);
    const first = got[0]!.sampleIndex;
    const rest = [0, 1, 2].filter((i) => i !== first);
    // The one received and acked is not sent again; the two that were held when the task was acked are delivered
    // (one of them was sent after the ack and never acked, the other was still held).
    expect(after.filter((t) => t.taskId === 'held-grp').map((t) => t.sampleIndex).sort()).toEqual(rest);
  }, 120_000);
});
