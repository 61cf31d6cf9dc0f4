import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import type { Journal } from '../../src/journal/journal.js';
import { mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

// Tasks arriving in a row on one stream with the journal on: the stream reads the next task once the previous one
// is admitted, not once its journal write is fsynced, so writes issued together share one commit (one fsync each
// used to cap a stream at ~100 tasks/s and kept acks waiting behind queued tasks). A cancel that arrives while a
// task's write is under way still cancels it.

const dirs: string[] = [];
const harnesses: ServerHarness[] = [];
afterEach(async () => {
  await Promise.all(harnesses.splice(0).map((h) => h.close()));
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

/**
 * TEST DOUBLE at the journal's seam: the real journal, whose `accepted` writes are held until `release()` (as a
 * slow disk would hold them), recording the task ids whose writes were issued.
 */
function holdAccepts(journal: Journal): { issued: string[]; release: () => void } {
  const real = journal.accepted.bind(journal);
  const issued: string[] = [];
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  journal.accepted = async (taskId, spec, numSamples, session) => {
    issued.push(taskId);
    await gate;
    return real(taskId, spec, numSamples, session);
  };
  return { issued, release };
}

describe('a stream with the journal on', () => {
  it('reads the next task while the previous one is being written, and a cancel during the write still cancels it', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollout-pipelining-'));
    dirs.push(dir);
    const h = await startServerHarness({ config: { journal: { dir } }, engine: { tokenLatencyMs: 2 } });
    harnesses.push(h);
    const held = holdAccepts(h.server.journal!);
    const session = h.client.openSession({ sessionId: 'pipelined' });
    const ids = ['p-0', 'p-1', 'p-2', 'p-3'];
    const answers = ids.map((id, i) => session.submit(mathTask(id, 1, 70 + i)));
    // All four writes are under way at once (before: the stream read p-1 only after p-0 was on disk).
    await eventually(() => held.issued.length === 4, `all four writes issued (issued: ${held.issued.join(', ')})`, 30_000);
    expect(held.issued).toEqual(ids);
    // A cancel for a task whose write is under way: it is accepted (it is on disk), then cancelled, not run to the end.
    session.cancel('p-2');
    held.release();
    const accepted = await Promise.all(answers);
    expect(accepted.map((a) => [a.taskId, a.duplicate])).toEqual(ids.map((id) => [id, false]));
    session.close();
    const got: Trajectory[] = [];
    for await (const t of session.trajectories()) got.push(t);
    const status = Object.fromEntries(got.map((t) => [t.taskId, t.status]));
    expect(status).toEqual({
      'p-0': TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
      'p-1': TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
      'p-2': TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED,
      'p-3': TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
    });
  }, 120_000);

  it('a task sent twice in a row on one stream is accepted once and owed once', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollout-pipelining-'));
    dirs.push(dir);
    const h = await startServerHarness({ config: { journal: { dir } } });
    harnesses.push(h);
    const held = holdAccepts(h.server.journal!);
    const session = h.client.openSession({ sessionId: 'twice' });
    const first = session.submit(mathTask('twice-0', 2, 80));
    const second = session.submit(mathTask('twice-0', 2, 80));
    await eventually(() => held.issued.length === 1, 'the first write issued', 30_000);
    held.release();
    const answers = await Promise.all([first, second]);
    expect(answers.map((a) => a.duplicate).sort()).toEqual([false, true]);
    session.close();
    const got: Trajectory[] = [];
    for await (const t of session.trajectories()) got.push(t);
    expect(got.map((t) => t.sampleIndex).sort()).toEqual([0, 1]);
  }, 120_000);
});
