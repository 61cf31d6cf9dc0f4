import { describe, expect, it } from 'vitest';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { journalSuite } from '../support/journal-suite.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';

// A trainer that acks sample by sample (the Python client's samples(), or any manual acker) and dies mid-group leaves
// a task acked in part. Submitted again on resume, it was answered `accepted{already_owed}` with the full num_samples,
// while the server re-sent only the unacked samples and never said the acked ones would not come: a client counting
// the task's samples waited for ever (found by review, helper-52). Submitting means "send me this task's samples": the
// acked ones are sent again, named in TaskAccepted.resent_sample_indexes, and owed again after a restart as well.

const suite = journalSuite();
const sampleKeys = (ts: readonly Trajectory[], taskId: string): number[] =>
  ts.filter((t) => t.taskId === taskId).map((t) => t.sampleIndex).sort((a, b) => a - b);

/** Submits a 3-sample task on `sessionId`, acks the first two samples that arrive, and breaks the stream. */
async function ackTwoThenDie(h: ServerHarness, sessionId: string, taskId: string): Promise<number[]> {
  const s = h.client.openSession({ sessionId, autoAck: false });
  const got: Trajectory[] = [];
  const reading = (async () => {
    for await (const t of s.trajectories()) {
      got.push(t);
      if (got.length <= 2) s.ack([{ taskId: t.taskId, sampleIndex: t.sampleIndex }]);
    }
  })().catch(() => undefined);
  await s.submit(mathTask(taskId, 3, 71));
  await eventually(() => got.length === 3, 'the three samples received', 60_000);
  const acked = got.slice(0, 2).map((t) => t.sampleIndex);
  await eventually(() => h.server.sessions.get(sessionId)?.unackedCount === 1, 'the two acks applied', 10_000);
  s.abort();
  await reading;
  await eventually(() => h.server.sessions.get(sessionId)?.isAttached === false, 'the stream detached');
  return acked.sort((a, b) => a - b);
}

describe('a task acked in part, submitted again on resume', () => {
  it('is answered with the samples sent again, and the whole task arrives; the stream ends (no journal)', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null } } });
    try {
      const acked = await ackTwoThenDie(h, 'part-mem', 'part');
      const resumed = h.client.openSession({ sessionId: 'part-mem', resume: true });
      const opened = await resumed.opened;
      expect({ redelivered: opened.redelivered, pending: opened.pending }).toEqual({ redelivered: 1, pending: 0 });
      const accepted = await resumed.submit(mathTask('part', 3, 71));
      expect(accepted.alreadyOwed).toBe(true);
      expect(accepted.resentSampleIndexes).toEqual(acked);
      resumed.close();
      const after: Trajectory[] = [];
      await within(
        (async () => {
          for await (const t of resumed.trajectories()) after.push(t);
        })(),
        30_000,
        'the resumed stream to end (the client counted the re-sent samples)',
      );
      expect(sampleKeys(after, 'part')).toEqual([0, 1, 2]);
      // Acked as consumed: nothing is owed any more, the session is closed.
      await eventually(() => h.server.sessions.get('part-mem') === undefined, 'the session closed');
    } finally {
      await h.close();
    }
  }, 120_000);

  it('owes the re-sent samples after a crash too (the journal records the debt before the answer)', async () => {
    const dir = await suite.dir('journal-part-');
    const a = await suite.server(dir);
    const acked = await ackTwoThenDie(a, 'part-j', 'part-j');
    const resumed = a.client.openSession({ sessionId: 'part-j', resume: true, autoAck: false });
    await resumed.opened;
    const accepted = await resumed.submit(mathTask('part-j', 3, 71));
    expect(accepted.resentSampleIndexes).toEqual(acked);
    // A kill -9 the moment the answer is in: what the journal has committed.
    const image = await suite.crashImage(a);
    resumed.abort();

    const b = await suite.server(image);
    const again = b.client.openSession({ sessionId: 'part-j', resume: true });
    const opened = await again.opened;
    expect(opened.redelivered + opened.pending).toBe(3);
    again.close();
    const restored: Trajectory[] = [];
    await within(
      (async () => {
        for await (const t of again.trajectories()) restored.push(t);
      })(),
      30_000,
      'the restored session to deliver and end',
    );
    expect(sampleKeys(restored, 'part-j')).toEqual([0, 1, 2]);
  }, 180_000);

  it('on the stream that acked them, the copies are counted: the stream still ends once they are consumed', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null } } });
    try {
      const s = h.client.openSession({ sessionId: 'same-stream' });
      await s.submit(mathTask('twice', 2, 73));
      const got: Trajectory[] = [];
      let again: Awaited<ReturnType<typeof s.submit>> | undefined;
      await within(
        (async () => {
          for await (const t of s.trajectories()) {
            got.push(t);
            if (got.length === 2) {
              // The first was acked as the loop came back for this one (autoAck): wait for the server to have it.
              await eventually(() => h.server.sessions.get('same-stream')?.unackedCount === 1, 'the first ack applied', 10_000);
              again = await s.submit(mathTask('twice', 2, 73));
              s.close();
            }
          }
        })(),
        30_000,
        'the stream to end',
      );
      expect(again?.resentSampleIndexes).toEqual([got[0]!.sampleIndex]);
      expect(got.map((t) => t.sampleIndex)).toEqual([got[0]!.sampleIndex, got[1]!.sampleIndex, got[0]!.sampleIndex]);
      // The copy was acked too (the client half-closed only after it): nothing owed, the session closed.
      await eventually(() => h.server.sessions.get('same-stream') === undefined, 'the session closed, everything acked');
    } finally {
      await h.close();
    }
  }, 120_000);

  it('re-sends nothing for a task none of whose samples were acked', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null } } });
    try {
      const s = h.client.openSession({ sessionId: 'none-acked', autoAck: false });
      const got: Trajectory[] = [];
      void (async () => {
        for await (const t of s.trajectories()) got.push(t);
      })().catch(() => undefined);
      await s.submit(mathTask('none', 2, 72));
      await eventually(() => got.length === 2, 'both samples', 60_000);
      const again = await s.submit(mathTask('none', 2, 72));
      expect({ alreadyOwed: again.alreadyOwed, resent: again.resentSampleIndexes }).toEqual({ alreadyOwed: true, resent: [] });
      s.abort();
    } finally {
      await h.close();
    }
  }, 120_000);
});
