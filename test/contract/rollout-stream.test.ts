import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskRejectedError } from '../../src/client/rollout-client.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask, startHarness, type Harness } from '../support/harness.js';

const OK = new Set([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED]);

describe('Rollout stream against a real server, bubblewrap sandboxes and the fake vLLM engine', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness();
  });
  afterAll(async () => h?.close());

  it('streams every sample of every GRPO group exactly once, with the token invariants', async () => {
    const session = h.client.openSession();
    const opened = await session.opened;
    expect(opened.sessionId).not.toBe('');
    const groups = 4;
    const n = 3;
    const accepted = await Promise.all(Array.from({ length: groups }, (_, g) => session.submit(mathTask(`grpo-${g}`, n, 100 + g, { groupId: `g${g}`, metadata: { step: '7' } }))));
    expect(accepted.map((a) => a.numSamples)).toEqual([n, n, n, n]);
    session.close();
    const trajectories = await collect(session.trajectories());

    expect(trajectories).toHaveLength(groups * n);
    const keys = trajectories.map((t) => `${t.taskId}#${t.sampleIndex}`);
    expect(new Set(keys).size).toBe(keys.length);
    for (let g = 0; g < groups; g++) {
      const group = trajectories.filter((t) => t.taskId === `grpo-${g}`);
      expect(group.map((t) => t.sampleIndex).sort()).toEqual([0, 1, 2]);
      expect(new Set(group.map((t) => t.groupId))).toEqual(new Set([`g${g}`]));
    }
    for (const t of trajectories) {
      expect(invariantViolations(t)).toEqual([]);
      expect(OK.has(t.status), `${t.taskId}#${t.sampleIndex}: ${TrajectoryStatus[t.status]} ${t.error}`).toBe(true);
      expect(t.metadata).toEqual({ step: '7' });
      expect(t.promptTokenIds.length).toBeGreaterThan(0);
      expect(t.numTurns).toBeGreaterThanOrEqual(1);
      expect([0, 1]).toContain(t.reward);
      expect(t.timing!.totalMs).toBeGreaterThan(0);
      expect(t.timing!.llmMs).toBeGreaterThanOrEqual(0);
      expect(t.rewardDetails).toHaveProperty('correct');
    }
    // The scripted policy calls python first: a sandboxed tool ran and its output came back as mask-0 tokens.
    const multiTurn = trajectories.filter((t) => t.numTurns >= 2);
    expect(multiTurn.length).toBeGreaterThan(0);
    expect(trajectories.some((t) => t.reward === 1)).toBe(true);
  });

  it('rejects bad specs naming the field, keeps serving, and completes the good tasks on the same stream', async () => {
    const session = h.client.openSession();
    const base = mathTask('bad-base', 1, 5);
    const bad: [string, Parameters<typeof session.submit>[0]][] = [
      ['environment', { ...base, taskId: 'bad-env', environment: 'no-such-env' }],
      ['instance.answer', { ...base, taskId: 'bad-answer', instance: { problem: 'What is 1 + 1?' } }],
      ['instance.problem', { ...base, taskId: 'bad-problem', instance: { problem: '', answer: '2' } }],
      ['num_samples', { ...base, taskId: 'bad-n0', numSamples: 0 }],
      ['num_samples', { ...base, taskId: 'bad-nbig', numSamples: 100_000 }],
      ['limits.max_turns', { ...base, taskId: 'bad-limits', limits: { maxTurns: -1, initTimeoutMs: 0, runTimeoutMs: 0, evalTimeoutMs: 0, totalTimeoutMs: 0 } }],
      ['sampling.top_p', { ...base, taskId: 'bad-topp', sampling: { topP: 1.5, maxTokensPerTurn: 0, maxTotalTokens: 0, stop: [] } }],
      ['instance', { ...base, taskId: 'bad-huge', instance: { problem: 'x'.repeat(2 << 20), answer: '1' } }],
      ['task_id', { ...base, taskId: '' }],
    ];
    const good = session.submit(mathTask('good-after-bad', 2, 9));
    for (const [field, spec] of bad) {
      const err = await session.submit(spec).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err, field).toBeInstanceOf(TaskRejectedError);
      expect((err as TaskRejectedError).field).toBe(field);
      expect((err as TaskRejectedError).reason).toContain(field);
    }
    const good2 = session.submit(mathTask('good-after-bad-2', 1, 10));
    await Promise.all([good, good2]);
    session.close();
    const trajectories = await collect(session.trajectories());
    expect(trajectories.map((t) => `${t.taskId}#${t.sampleIndex}`).sort()).toEqual(['good-after-bad#0', 'good-after-bad#1', 'good-after-bad-2#0']);
    expect(trajectories.every((t) => OK.has(t.status))).toBe(true);
  });

  it('delivers a task re-submitted on a new stream (idempotent task_id) without running it twice', async () => {
    const first = h.client.openSession();
    await first.submit(mathTask('idem-1', 2, 21));
    first.close();
    const run1 = await collect(first.trajectories());
    const served = h.engine.requestsServed;

    const second = h.client.openSession();
    const again = await second.submit(mathTask('idem-1', 2, 21));
    expect(again.duplicate).toBe(true);
    second.close();
    const run2 = await collect(second.trajectories());
    expect(run2.map((t) => t.sampleIndex).sort()).toEqual([0, 1]);
    expect(run2.map((t) => t.responseTokenIds)).toEqual(expect.arrayContaining(run1.map((t) => t.responseTokenIds)));
    expect(h.engine.requestsServed).toBe(served);

    const third = h.client.openSession();
    const conflict = await third.submit(mathTask('idem-1', 3, 21)).catch((e: unknown) => e);
    expect((conflict as TaskRejectedError).field).toBe('task_id');
    third.close();
  });

  it('a resumed stream that re-sends a task its session had accepted still ends once everything owed arrived', async () => {
    const s1 = h.client.openSession({ sessionId: 'resend-owed', autoAck: false });
    await s1.submit(mathTask('owed-a', 2, 41));
    s1.abort();
    await new Promise((r) => setTimeout(r, 200));

    const s2 = h.client.openSession({ sessionId: 'resend-owed', resume: true });
    const opened = await s2.opened;
    expect(opened.redelivered + opened.pending).toBe(2);
    // The client cannot know whether its first submit reached the server, so it sends the task again.
    const again = await s2.submit(mathTask('owed-a', 2, 41));
    expect(again).toMatchObject({ duplicate: true, alreadyOwed: true });
    s2.close();
    const hang = new Promise<never>((_, reject) => setTimeout(() => reject(new Error('trajectories() did not end')), 20_000));
    const rest = await Promise.race([collect(s2.trajectories()), hang]);
    expect(rest.map((t) => `${t.taskId}#${t.sampleIndex}`).sort()).toEqual(['owed-a#0', 'owed-a#1']);
  });

  it('keeps no per-task state for completed tasks; a completed, acked task re-sent on the same stream comes again and the stream still ends', async () => {
    const session = h.client.openSession();
    const ids = Array.from({ length: 12 }, (_, i) => `forget-${i}`);
    await Promise.all(ids.map((id, i) => session.submit(mathTask(id, 2, 300 + i))));
    const stream = session.trajectories();
    const got: Trajectory[] = [];
    while (got.length < ids.length * 2) got.push((await stream.next()).value as Trajectory);
    // White-box: what the client holds per task while a stream lives (a week-long stream must not grow with it).
    expect((session as unknown as { openTasks: Map<string, unknown> }).openTasks.size).toBe(0);
    // The session forgot it too (delivered and acked — autoAck acks a trajectory when the loop asks for the next, so
    // not the task of the last one), so it is a new debt: its trajectories are sent again.
    const pick = ids.findIndex((id) => id !== got.at(-1)!.taskId);
    expect(await session.submit(mathTask(ids[pick]!, 2, 300 + pick))).toMatchObject({ duplicate: true, alreadyOwed: false });
    session.close();
    const hang = new Promise<never>((_, reject) => setTimeout(() => reject(new Error('trajectories() did not end')), 20_000));
    const rest = await Promise.race([collect(stream), hang]);
    expect(rest.map((t) => `${t.taskId}#${t.sampleIndex}`).sort()).toEqual([`${ids[pick]}#0`, `${ids[pick]}#1`]);
    expect(rest.map((t) => t.responseTokenIds)).toEqual(expect.arrayContaining(got.filter((t) => t.taskId === ids[pick]).map((t) => t.responseTokenIds)));
  });

  it('resumes a broken session: unacked trajectories come again, acked ones do not', async () => {
    const s1 = h.client.openSession({ sessionId: 'resume-me', autoAck: false });
    await s1.submit(mathTask('resume-a', 2, 31));
    await s1.submit(mathTask('resume-b', 2, 32));
    const got: string[] = [];
    for await (const t of s1.trajectories()) {
      got.push(`${t.taskId}#${t.sampleIndex}`);
      if (got.length === 1) s1.ack([{ taskId: t.taskId, sampleIndex: t.sampleIndex }]);
      if (got.length === 2) break;
    }
    // Give the ack time to reach the server, then drop the connection without closing cleanly.
    await new Promise((r) => setTimeout(r, 200));
    s1.abort();
    await new Promise((r) => setTimeout(r, 200));

    const s2 = h.client.openSession({ sessionId: 'resume-me', resume: true });
    const opened = await s2.opened;
    s2.close();
    const rest = (await collect(s2.trajectories())).map((t) => `${t.taskId}#${t.sampleIndex}`);
    expect(opened.redelivered).toBeGreaterThanOrEqual(1);
    expect(rest).not.toContain(got[0]);
    expect(rest).toContain(got[1]);
    expect(new Set([...got, ...rest])).toEqual(new Set(['resume-a#0', 'resume-a#1', 'resume-b#0', 'resume-b#1']));

    // The resumed stream acked what it received before half-closing, so the session ended cleanly: nothing is
    // owed any more and it cannot be resumed again.
    const s3 = h.client.openSession({ sessionId: 'resume-me', resume: true });
    const gone = (await s3.opened.catch((e: unknown) => e)) as { code?: number };
    expect(gone.code).toBe(5); // NOT_FOUND
  });
});

describe('Rollout stream controls', () => {
  let h: Harness;
  beforeAll(async () => {
    // Slow enough that a cancel arrives while the samples are still running.
    h = await startHarness({}, { tokenLatencyMs: 20 });
  });
  afterAll(async () => h?.close());

  it('sends stage events to a session that asks, and a cancel on the stream ends the task as CANCELLED', async () => {
    const session = h.client.openSession({ stageEvents: true });
    const stages: string[] = [];
    session.onStage = (e) => stages.push(`${e.taskId}#${e.sampleIndex}:${e.stage}`);
    await session.submit(mathTask('stream-fast', 1, 61));
    await session.submit(mathTask('stream-cancel', 2, 62, { sampling: { maxTokensPerTurn: 256, maxTotalTokens: 4096, stop: [] } }));
    session.cancel('stream-cancel');
    session.close();
    const trajectories = await collect(session.trajectories());
    const byKey = new Map(trajectories.map((t) => [`${t.taskId}#${t.sampleIndex}`, t]));
    expect([...byKey.keys()].sort()).toEqual(['stream-cancel#0', 'stream-cancel#1', 'stream-fast#0']);
    expect(byKey.get('stream-cancel#0')!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED);
    expect(byKey.get('stream-cancel#1')!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED);
    expect(OK.has(byKey.get('stream-fast#0')!.status)).toBe(true);
    // Stage enum values: QUEUED 1, INIT 2, RUN 3, EVAL 4, DONE 5.
    const fast = stages.filter((s) => s.startsWith('stream-fast#0:')).map((s) => Number(s.split(':')[1]));
    expect(fast).toEqual([1, 2, 3, 4, 5]);
    expect(stages.filter((s) => s.startsWith('stream-cancel#0:')).at(-1)).toBe('stream-cancel#0:5');
  });
});
