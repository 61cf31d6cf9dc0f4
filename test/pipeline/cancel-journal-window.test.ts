import { describe, expect, it } from 'vitest';
import { status, type ServiceError } from '@grpc/grpc-js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { journalSuite } from '../support/journal-suite.js';
import { TrajectoryReader } from '../support/server-harness.js';
import { CountingDriver, probeEnvironment, probePolicy, probeTask, ProbeState } from '../support/probe-environment.js';

const S = TrajectoryStatus;
const suite = journalSuite();

// Regression (pipeline review, 2026-12-02): a task is in the task store from admission, but its samples are made only
// once its journal write commits. A unary Cancel in that window found the task, cancelled none of its (not yet made)
// samples, answered OK with cancelled: 0, and the task then ran to COMPLETED. It is now marked and its samples are
// cancelled as they are made; the answer counts them.
describe('cancel by task id while the task is being journaled', () => {
  it('a unary Cancel that finds the task accepted stops it, in the journal window too: it never completes afterwards', async () => {
    const state = new ProbeState();
    const h = await suite.server(await suite.dir('cancel-window-'), {
      sandboxes: new CountingDriver(),
      registry: defaultRegistry().register(probeEnvironment(state)),
      engine: { policy: probePolicy },
    });
    const session = h.client.openSession();
    await session.opened;
    const reader = new TrajectoryReader(session);
    // Each task waits in its run stage for a gate the test holds, so none can finish before its cancel lands; the
    // cancel is sent as soon as the task is known (NOT_FOUND before), which often falls in the journal window.
    const n = 40;
    for (let i = 0; i < n; i++) {
      const taskId = `window-${i}`;
      const accepted = session.submit(probeTask(taskId, { run: `tool:g-${taskId}` }));
      for (;;) {
        const r = await h.client.cancel(taskId).then(
          (x) => x,
          (e: ServiceError) => e,
        );
        if ('code' in r && r.code === status.NOT_FOUND) continue;
        if ('code' in r) throw r;
        expect(r.cancelled, taskId).toBe(1);
        break;
      }
      await accepted;
    }
    for (let i = 0; i < n; i++) state.open(`g-window-${i}`);
    const got = await reader.take(n);
    expect(got.filter((t) => t.status !== S.TRAJECTORY_STATUS_CANCELLED).map((t) => `${t.taskId}:${S[t.status]}`)).toEqual([]);
    await h.close();
  }, 60_000);
});
