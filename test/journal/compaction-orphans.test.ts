import { open } from 'lmdb';
import { describe, expect, it } from 'vitest';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { journalSuite } from '../support/journal-suite.js';
import type { ServerHarness } from '../support/server-harness.js';

const suite = journalSuite();

const journaled = (dir: string, tokenLatencyMs: number): Promise<ServerHarness> => suite.server(dir, { engine: { tokenLatencyMs } });

/**
 * Journal.compact issues `remove(task)` then `remove(result)`/`remove(ack)` as separate writes; lmdb-js (with
 * eventTurnBatching off, as the journal opens it) commits them in several transactions (see split-commit.ts in this
 * folder: a SIGKILL right after the first commit left e.g. 1085 task keys and 1086 result keys of 2000 removed).
 * A kill -9 between those commits leaves a result without its task: that state is built here directly.
 */
describe('a kill -9 in the middle of a compaction (task key removed, its result keys not yet)', () => {
  it('the orphaned result is not attached to a later task with the same task_id (an epoch-2 re-submit)', async () => {
    const dir = await suite.dir('journal-orphan-');
    const a = await journaled(dir, 0);
    await a.client.submit(mathTask('e1', 1, 41, { metadata: { epoch: '1' } }));
    await a.client.getTrajectory('e1', { wait: true, deadlineMs: 60_000 });
    await a.close();
    const db = open({ path: dir, compression: false });
    db.removeSync(['t', 'e1']); // the first of compaction's commits; the process dies before the next one
    await db.close();

    // Epoch 2: the same task id (content-derived ids, as the dataset runner makes them), accepted as a new task.
    const b = await journaled(dir, 300);
    const session = b.client.openSession({ sessionId: 'epoch2', autoAck: false });
    const accepted = await session.submit(mathTask('e1', 1, 41, { metadata: { epoch: '2' } }));
    expect(accepted.duplicate).toBe(false);
    session.abort();
    await b.close(); // before its sample finished (kill -9 or a redeploy): it must run again at the next start

    const c = await journaled(dir, 0);
    const resumed = c.client.openSession({ sessionId: 'epoch2', resume: true });
    await resumed.opened;
    resumed.close();
    const after: Trajectory[] = [];
    for await (const t of resumed.trajectories()) after.push(t);
    // Today: epoch 1's trajectory comes back as epoch 2's sample 0, which is never run.
    expect(after.map((t) => [t.taskId, t.metadata['epoch']])).toEqual([['e1', '2']]);
  }, 120_000);
});
