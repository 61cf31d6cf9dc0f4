import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { status } from '@grpc/grpc-js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';
import { bulkyEnvironment } from '../support/test-environments.js';

const MiB = 1 << 20;

/** Bytes the server's detached sessions hold (sent and unacked, or finished and held). */
const detachedBytes = (h: ServerHarness): number => {
  let total = 0;
  for (let i = 0; i < 64; i++) {
    const s = h.server.sessions.get(`hoard-${i}`);
    if (s && s.detachedAt !== undefined) total += s.unackedBytes + s.heldBytes;
  }
  return total;
};

describe('sessions abandoned with unacked trajectories hold a bounded total (sessions.maxDetachedBytes)', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({
      engine: { policy: () => 'done' },
      sandboxes: new NullSandboxDriver(),
      registry: defaultRegistry().register(bulkyEnvironment),
      config: { sessions: { maxUnackedBytes: 2 * MiB, maxDetachedBytes: 6 * MiB, maxOutboxBytes: 64 * 1024 }, retainFinishedBytes: 4 * MiB },
    });
  });
  afterAll(async () => h?.close());

  it('a client that fills session after session and abandons each never makes the server hold more than the bound; the latest stays resumable', async () => {
    const SESSIONS = 8;
    let accepted = 0;
    for (let k = 0; k < SESSIONS; k++) {
      // Refusals come back at once (no client retry): the refusal is how the test knows the session is full.
      const session = h.client.openSession({ sessionId: `hoard-${k}`, autoAck: false, retryRejectedForMs: 0 });
      await session.opened;
      // 512 KiB trajectories, never acked, until the session's own 2 MiB bound pauses it (its next task is refused).
      accepted = 0;
      for (let i = 0; i < 8; i++) {
        const ok = await session.submit({ taskId: `hoard-${k}-${i}`, environment: 'bulky', numSamples: 1, instance: { n: i } }).then(() => true, () => false);
        if (!ok) break;
        accepted++;
        await eventually(() => h.server.runtime.pipeline.inFlight === 0, 'the task to finish', 30_000);
      }
      expect(accepted).toBeGreaterThanOrEqual(4);
      session.abort();
      await eventually(() => h.server.sessions.get(`hoard-${k}`)?.detachedAt !== undefined || h.server.sessions.get(`hoard-${k}`) === undefined, 'the session to detach');
      expect(detachedBytes(h)).toBeLessThanOrEqual(6 * MiB);
    }
    // The most recent one is still there to resume, with everything it was owed.
    const resumed = h.client.openSession({ sessionId: `hoard-${SESSIONS - 1}`, resume: true, autoAck: true });
    expect((await resumed.opened).redelivered + (await resumed.opened).pending).toBe(accepted);
    resumed.abort();
    // An evicted one is told so (NOT_FOUND: open it without resume), never left waiting.
    const evicted = h.client.openSession({ sessionId: 'hoard-0', resume: true });
    const err = await evicted.opened.then(() => undefined, (e: { code?: number }) => e);
    expect(err?.code).toBe(status.NOT_FOUND);
  }, 120_000);
});
