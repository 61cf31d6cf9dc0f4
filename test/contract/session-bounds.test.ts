import { runInNewContext } from 'node:vm';
import { setFlagsFromString } from 'node:v8';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type DeliveryPaused, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { TaskRejectedError, type RolloutSession } from '../../src/client/rollout-client.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';
import { BULKY_REPORT_BYTES, bulkyEnvironment } from '../support/test-environments.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
const heapUsed = (): number => {
  gc();
  gc();
  return process.memoryUsage().heapUsed;
};

const MiB = 1 << 20;

const task = (taskId: string) => ({ taskId, environment: 'bulky', numSamples: 1, instance: { n: Number(taskId.replace(/\D/g, '') || 0) } });

/** Drains a session's iterator in the background, keeping only the keys (the test must not hold the bytes). */
function drain(session: RolloutSession): { keys: string[]; done: Promise<void> } {
  const keys: string[] = [];
  const done = (async () => {
    for await (const t of session.trajectories()) {
      expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
      keys.push(`${t.taskId}#${t.sampleIndex}`);
    }
  })();
  return { keys, done };
}

describe('sessions bounded in bytes, against a real server', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({
      engine: { policy: () => 'done' },
      sandboxes: new NullSandboxDriver(),
      registry: defaultRegistry().register(bulkyEnvironment),
      config: { sessions: { maxUnackedBytes: 4 * MiB, maxOutboxBytes: 64 * 1024 }, retainFinishedBytes: 8 * MiB },
    });
  });
  afterAll(async () => h?.close());

  it('a client that never acks: delivery pauses at the bound, it is told, memory stays bounded; after acks nothing is lost', async () => {
    const before = heapUsed();
    const session = h.client.openSession({ sessionId: 'never-acks', autoAck: false, retryRejectedForMs: 0 });
    const notices: DeliveryPaused[] = [];
    session.onDeliveryPaused = (n) => notices.push(n);
    const opened = await session.opened;
    expect(opened.maxUnackedBytes).toBe(4 * MiB);
    const received = new Map<string, Trajectory | undefined>();
    const consumer = (async () => {
      for await (const t of session.trajectories()) received.set(`${t.taskId}#${t.sampleIndex}`, undefined);
    })();

    // A trainer that keeps four tasks in flight and never acks: 200 × 512 KiB = 100 MiB if it all ran.
    const attempts = 200;
    const rejected: string[] = [];
    const accepted: string[] = [];
    let peakHeld = 0;
    const submitOne = async (i: number): Promise<void> => {
      try {
        await session.submit(task(`na-${i}`));
        accepted.push(`na-${i}`);
      } catch (err) {
        expect(err).toBeInstanceOf(TaskRejectedError);
        expect((err as TaskRejectedError).reason).toContain('paused');
        rejected.push(`na-${i}`);
      }
    };
    for (let i = 0; i < attempts; i += 4) {
      await Promise.all([0, 1, 2, 3].map((k) => submitOne(i + k)));
      peakHeld = Math.max(peakHeld, h.server.sessions.stats().heldBytes);
      await eventually(() => accepted.every((id) => received.has(`${id}#0`)) || notices.length > 0, 'deliveries or a pause', 30_000);
    }
    await eventually(() => h.server.runtime.pipeline.inFlight === 0, 'the admitted work to finish', 30_000);
    const stats = h.server.sessions.stats();
    peakHeld = Math.max(peakHeld, stats.heldBytes);

    expect(notices[0]).toMatchObject({ resumed: false, limitBytes: 4 * MiB });
    expect(notices[0]!.reason).toContain('ack');
    expect(stats.unackedBytes).toBeLessThanOrEqual(4 * MiB);
    expect(received.size).toBeGreaterThanOrEqual(6); // about 4 MiB / 512 KiB were sent before the pause
    expect(received.size).toBeLessThanOrEqual(8);
    expect(rejected.length).toBeGreaterThan(attempts / 2);
    // Held: only what was in flight when the bound was reached (at most four tasks' worth), never dropped.
    expect(peakHeld).toBeLessThanOrEqual(4 * (BULKY_REPORT_BYTES + 64 * 1024));
    const grown = heapUsed() - before;
    console.log(`never-acks: ${accepted.length} accepted, ${rejected.length} refused, ${received.size} sent, held peak ${(peakHeld / MiB).toFixed(1)} MiB, unacked ${(stats.unackedBytes / MiB).toFixed(1)} MiB, heap +${(grown / MiB).toFixed(1)} MiB`);
    expect(grown).toBeLessThan(40 * MiB);

    // Acks bring delivery back: the held ones come (resumed notice), then the refused tasks, submitted again, come too.
    const ackAll = (): void => session.ack([...received.keys()].map((k) => ({ taskId: k.split('#')[0]!, sampleIndex: 0 })));
    ackAll();
    await eventually(() => accepted.every((id) => received.has(`${id}#0`)), 'the held trajectories after acks', 30_000);
    expect(notices.at(-1)).toMatchObject({ resumed: true, held: 0 });
    for (const id of rejected) {
      ackAll();
      await session.submit(task(id));
      await eventually(() => received.has(`${id}#0`), `${id} after resubmitting`, 30_000);
    }
    ackAll();
    session.close();
    await within(consumer, 30_000, 'the session to end');
    expect([...received.keys()].sort()).toEqual(Array.from({ length: attempts }, (_, i) => `na-${i}#0`).sort());
    // 200 × 512 KiB went through the server; it keeps only the task store's budget (8 MiB by its estimate).
    const after = heapUsed() - before;
    console.log(`after 200 large trajectories: heap +${(after / MiB).toFixed(1)} MiB, task store ${(h.server.runtime.store.bytes / MiB).toFixed(1)} MiB`);
    expect(h.server.runtime.store.bytes).toBeLessThanOrEqual(8 * MiB + 2 * MiB);
    expect(after).toBeLessThan(40 * MiB);
  }, 180_000);

  it('a client that stops reading: its outbox stays bounded in bytes, other clients are served, and it gets everything when it reads again', async () => {
    const stalled = h.client.openSession({ sessionId: 'stalled', stageEvents: true, highWater: 1, retryRejectedForMs: 0 });
    await stalled.opened;
    // Submitted without waiting and never consumed: the client reads on while a submit waits for its answer (answers
    // come on the same call), so what bounds the session is the server's unacked-bytes limit; once no submit is
    // pending, its one-trajectory buffer is full and it stops reading. Refusals ('paused') can arrive while the
    // submits are still going out, so their outcome is watched from the start (a rejection with no handler yet is
    // an unhandled rejection).
    const submits = Array.from({ length: 24 }, (_, i) => stalled.submit(task(`st-${i}`)));
    const outcomes = Promise.allSettled(submits);
    await eventually(() => h.server.sessions.get('stalled')!.deliveryPaused, 'the stalled session to reach its bound', 30_000);
    await eventually(() => h.server.runtime.pipeline.inFlight === 0, 'the admitted work to finish', 30_000);
    const s = h.server.sessions.get('stalled')!;
    console.log(`stalled reader: outbox ${(s.outboxBytes / MiB).toFixed(2)} MiB, unacked ${(s.unackedBytes / MiB).toFixed(2)} MiB, held ${s.heldCount}`);
    // Trajectories in the outbox are unacked ones (≤ 4 MiB); everything else is cut at 64 KiB (stage events dropped).
    expect(s.unackedBytes).toBeLessThanOrEqual(4 * MiB);
    expect(s.outboxBytes).toBeLessThanOrEqual(4 * MiB + 64 * 1024 + 16 * 1024);

    // Meanwhile another trainer is served as usual.
    const other = h.client.openSession({ sessionId: 'other', retryRejectedForMs: 0 });
    const otherOut = drain(other);
    await Promise.all(Array.from({ length: 5 }, (_, i) => other.submit(task(`ot-${i}`))));
    other.close();
    await within(otherOut.done, 30_000, 'the other session');
    expect(otherOut.keys.sort()).toEqual(['ot-0#0', 'ot-1#0', 'ot-2#0', 'ot-3#0', 'ot-4#0']);

    // Reading again (with acks as it consumes): every trajectory of the tasks the server accepted, each once.
    const out = drain(stalled);
    const settled = await outcomes;
    const acceptedIds = settled.flatMap((r, i) => (r.status === 'fulfilled' ? [`st-${i}#0`] : []));
    for (const r of settled) if (r.status === 'rejected') expect((r.reason as TaskRejectedError).reason).toContain('paused');
    expect(acceptedIds.length).toBeGreaterThan(0);
    stalled.close();
    await within(out.done, 30_000, 'the stalled session to deliver everything');
    expect(out.keys.sort()).toEqual(acceptedIds.sort());
  }, 120_000);
});
