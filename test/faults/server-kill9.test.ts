import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { spawnServe, type ServeProcess } from '../support/rollout-process.js';
import { eventually, within } from '../support/wait.js';

const TASKS = 24;
const SAMPLES = 2;
const key = (t: { taskId: string; sampleIndex: number }): string => `${t.taskId}#${t.sampleIndex}`;

describe('the server killed -9 mid-load and restarted on the same journal', () => {
  let engine: FakeVllmEngine;
  let dir: string;
  const servers: ServeProcess[] = [];

  beforeAll(async () => {
    // The fake vLLM (a test double) lives in the test process, so it outlives the server it serves.
    engine = await FakeVllmEngine.start({ tokenizer: (await loadQwen3()).tokenizer, tokenLatencyMs: 3 });
    dir = await mkdtemp(join(tmpdir(), 'rollout-kill9-'));
  });
  afterAll(async () => {
    for (const s of servers) s.child.kill('SIGKILL');
    await engine.close();
    await rm(dir, { recursive: true, force: true });
  });

  const serve = async (): Promise<ServeProcess> => {
    const s = await spawnServe(['--backend', engine.url, '--model', engine.model, '--journal-dir', dir, '--run-concurrency', '4']);
    servers.push(s);
    return s;
  };

  it('accounts for every accepted task exactly once: acked ones never again, the rest delivered once on resume, re-run or as journaled', async () => {
    const first = await serve();
    const client = new RolloutClient(first.address);
    const session = client.openSession({ sessionId: 'trainer-1', autoAck: false });
    await session.opened;
    const ids = Array.from({ length: TASKS }, (_, i) => `task-${i}`);
    await Promise.all(ids.map((id, i) => session.submit(mathTask(id, SAMPLES, 100 + i))));

    const before = new Map<string, number>();
    const reading = (async () => {
      try {
        for await (const t of session.trajectories()) before.set(key(t), (before.get(key(t)) ?? 0) + 1);
      } catch {
        // The stream breaks when the server is killed.
      }
    })();
    await eventually(() => before.size >= 12, 'a dozen trajectories before the kill', 60_000);
    // Ack the first ten received; then a fence: the server handles one stream's requests in order and journals in
    // order, so the fence's TaskAccepted (sent once it is fsynced) proves the acks before it are on disk.
    const acked = [...before.keys()].slice(0, 10);
    session.ack(acked.map((k) => ({ taskId: k.split('#')[0]!, sampleIndex: Number(k.split('#')[1]) })));
    await session.submit(mathTask('fence', 1, 999));
    ids.push('fence');
    first.child.kill('SIGKILL');
    expect((await first.exited).signal).toBe('SIGKILL');
    await reading;
    client.close();
    const all = ids.flatMap((id) => Array.from({ length: id === 'fence' ? 1 : SAMPLES }, (_, i) => `${id}#${i}`));
    expect(before.size, 'the kill must land mid-load').toBeLessThan(all.length);
    for (const n of before.values()) expect(n).toBe(1);

    const second = await serve();
    // pino writes asynchronously: the report may follow the "listening" line.
    await eventually(() => second.logs('recovered from the journal').length > 0, 'the recovery report', 30_000);
    const [report] = second.logs('recovered from the journal');
    expect(report, second.output()).toMatchObject({ sessions: 1, tasks: TASKS + 1, invalidTasks: 0 });
    expect(report!.requeuedSamples as number).toBeGreaterThan(0);
    expect((report!.finishedSamples as number) + (report!.requeuedSamples as number)).toBe(all.length);
    const client2 = new RolloutClient(second.address);
    try {
      const resumed = client2.openSession({ sessionId: 'trainer-1', resume: true });
      const opened = await resumed.opened;
      expect(opened.redelivered + opened.pending).toBe(all.length - acked.length);
      resumed.close();
      const after: Trajectory[] = [];
      await within((async () => {
        for await (const t of resumed.trajectories()) after.push(t);
      })(), 120_000, 'the resumed session to receive what it had not acked');

      const afterKeys = after.map(key);
      // Exactly once after the restart: every sample not acked, no acked one, none twice.
      expect(new Set(afterKeys).size).toBe(afterKeys.length);
      expect(afterKeys.filter((k) => acked.includes(k))).toEqual([]);
      expect(new Set([...afterKeys, ...acked])).toEqual(new Set(all));
      // Truthful: the fake engine answers, so every sample completed (none turned into a failure by the restart).
      expect(after.filter((t) => t.status !== TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED).map((t) => `${key(t)}: ${t.status} ${t.error}`)).toEqual([]);
      // What had finished before the kill is delivered as it was (same bytes: same tokens and reward), not run again.
      const redelivered = after.filter((t) => before.has(key(t)));
      expect(redelivered.length).toBe(before.size - acked.length);

      // A re-submit of a task accepted before the crash is a duplicate; GetTrajectory still finds finished tasks.
      const again = await client2.submit(mathTask('task-0', SAMPLES, 100));
      expect(again.duplicate).toBe(true);
      const [ackedTask, ackedSample] = acked[0]!.split('#');
      const got = await client2.getTrajectory(ackedTask!, { sampleIndex: Number(ackedSample) });
      expect(got.trajectories.map(key)).toEqual([acked[0]]);
    } finally {
      client2.close();
      second.child.kill('SIGTERM');
    }
    expect((await second.exited).code).toBe(0);
  }, 240_000);
});
