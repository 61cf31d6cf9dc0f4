import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { status, type ServiceError } from '@grpc/grpc-js';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { PauseMode } from '../../gen/ts/rollout/v1/backend.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';
import { Journal } from '../../src/journal/journal.js';
import { silentLogger } from '../../src/observability/logger.js';

const dirs: string[] = [];
const harnesses: ServerHarness[] = [];
afterEach(async () => {
  vi.restoreAllMocks();
  await Promise.all(harnesses.splice(0).map((h) => h.close()));
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

async function journaled(dir: string, tokenLatencyMs: number): Promise<ServerHarness> {
  const h = await startServerHarness({ config: { journal: { dir }, run: { concurrency: 1 } }, engine: { tokenLatencyMs } });
  harnesses.push(h);
  return h;
}

describe('a journaled server stopped and started again', () => {
  it('runs again what a shutdown cancelled (never delivering it CANCELLED first) and a resumed session gets each unacked sample once', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollout-restart-'));
    dirs.push(dir);
    const a = await journaled(dir, 5);
    const session = a.client.openSession({ sessionId: 'graceful', autoAck: false });
    await Promise.all(['g-0', 'g-1', 'g-2', 'g-3'].map((id, i) => session.submit(mathTask(id, 1, 40 + i))));
    const before: Trajectory[] = [];
    const reading = (async () => {
      try {
        for await (const t of session.trajectories()) before.push(t);
      } catch {
        // The stream ends with the server.
      }
    })();
    await eventually(() => before.length >= 1, 'a first trajectory', 60_000);
    session.ack([{ taskId: before[0]!.taskId, sampleIndex: 0 }]);
    // A fence: its acceptance is fsynced after the ack was written.
    await session.submit(mathTask('g-fence', 1, 99));
    await a.close();
    await reading;
    expect(before.filter((t) => t.status !== TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED)).toEqual([]);

    const b = await journaled(dir, 0);
    // Unary calls see the tasks accepted before the restart.
    expect((await b.client.submit(mathTask('g-1', 1, 41))).duplicate).toBe(true);
    const resumed = b.client.openSession({ sessionId: 'graceful', resume: true });
    await resumed.opened;
    resumed.close();
    const after: Trajectory[] = [];
    for await (const t of resumed.trajectories()) after.push(t);
    const keys = after.map((t) => t.taskId).sort();
    expect(keys).toEqual(['g-0', 'g-1', 'g-2', 'g-3', 'g-fence'].filter((id) => id !== before[0]!.taskId));
    expect(after.map((t) => t.status)).toEqual(after.map(() => TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED));
    await b.close();
    // The session acked everything and closed cleanly, so the journal forgot it; every task it holds is finished.
    const { journal, contents } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    await journal.close();
    expect(contents.sessions).toEqual([]);
    expect(contents.tasks.map((t) => [t.taskId, t.finished.size])).toEqual(['g-0', 'g-1', 'g-2', 'g-3', 'g-fence'].map((id) => [id, 1]));
  }, 180_000);
});

describe('a journaled server restarted around a weight sync', () => {
  it('comes back at the version its engines serve, paused if it stopped during a pool-wide pause, until the trainer resumes', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollout-restart-weights-'));
    dirs.push(dir);
    const start = async (): Promise<ServerHarness> => {
      const h = await startServerHarness({ config: { journal: { dir }, adminToken: 'w' } });
      harnesses.push(h);
      return h;
    };
    const a = await start();
    await a.client.pauseGeneration(PauseMode.PAUSE_MODE_ABORT);
    await a.client.resumeGeneration({ policyVersion: 7 });
    await a.client.pauseGeneration(PauseMode.PAUSE_MODE_WAIT); // the next update begins ...
    await a.close(); // ... and the server is redeployed before the trainer's resume

    const b = await start();
    expect((await b.client.listBackends()).map((x) => [x.paused, x.policyVersion])).toEqual([[true, 7]]);
    const session = b.client.openSession();
    await session.submit(mathTask('after-restart', 1, 5));
    session.close();
    const done = (async () => {
      const out: Trajectory[] = [];
      for await (const t of session.trajectories()) out.push(t);
      return out;
    })();
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(b.engine.stats().received).toBe(0); // held at the gate: no request reaches an engine being updated
    await b.client.resumeGeneration({ policyVersion: 8 });
    const [t] = await done;
    expect(t!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
    expect([t!.policyVersionMin, t!.policyVersionMax]).toEqual([8, 8]);
    await b.close();
    const { journal, contents } = Journal.open({ dir, maxBytes: 1 << 30, logger: silentLogger() });
    await journal.close();
    expect(contents.weights).toMatchObject({ paused: false, policyVersion: 8 });
  }, 120_000);

  it('answers UNAVAILABLE, not OK, to a pool-wide pause or resume whose state the journal could not record, and a retry records it', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollout-weights-'));
    dirs.push(dir);
    const a = await journaled(dir, 5);
    // The disk is full: the weights record's write fails (what lmdb reports for ENOSPC).
    const full = vi.spyOn(Journal.prototype, 'weightsChanged').mockRejectedValue(Object.assign(new Error('ENOSPC: no space left on device'), { code: 'ENOSPC' }));
    const refused = await a.client.pauseGeneration(PauseMode.PAUSE_MODE_WAIT).catch((err: unknown) => err as ServiceError);
    expect(refused).toMatchObject({ code: status.UNAVAILABLE });
    expect((refused as ServiceError).details).toMatch(/generation is paused, but the journal could not record it.*ENOSPC/u);
    full.mockRestore();
    // The pause is in effect (idempotent): retried with the journal writing, it is recorded, and a restart finds it.
    expect((await a.client.pauseGeneration(PauseMode.PAUSE_MODE_WAIT)).map((b) => b.paused)).toEqual([true]);
    vi.spyOn(Journal.prototype, 'weightsChanged').mockRejectedValueOnce(new Error('ENOSPC: no space left on device'));
    expect(await a.client.resumeGeneration({ policyVersion: 3 }).catch((err: unknown) => (err as ServiceError).code)).toBe(status.UNAVAILABLE);
    await a.close();
    const b = await journaled(dir, 5);
    // The resume was not recorded: the restarted server is still paused, at the version before (the safe direction).
    expect((await b.client.listBackends()).map((x) => [x.paused, x.policyVersion])).toEqual([[true, 0]]);
    await b.client.resumeGeneration({ policyVersion: 3 });
    expect((await b.client.listBackends()).map((x) => [x.paused, x.policyVersion])).toEqual([[false, 3]]);
  });
});

