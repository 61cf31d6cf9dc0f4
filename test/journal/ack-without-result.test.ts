import { describe, expect, it } from 'vitest';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { journalSuite } from '../support/journal-suite.js';
import type { ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

const suite = journalSuite();

const journaled = (dir: string): Promise<ServerHarness> => suite.server(dir);

describe('a trajectory whose journal write failed (a transient ENOSPC), delivered and acked anyway', () => {
  it('is not run again and delivered again to the session that acked it after a restart', async () => {
    const dir = await suite.dir('journal-ackonly-');
    const a = await journaled(dir);
    // The trajectory's write fails once (what a momentarily full disk does); later writes succeed.
    const db = (a.server.journal as unknown as { db: { put: (k: unknown, v: unknown) => Promise<boolean> } }).db;
    const put = db.put.bind(db);
    let failed = false;
    db.put = (key: unknown, value: unknown) => {
      if (!failed && Array.isArray(key) && key[0] === 'r') {
        failed = true;
        return Promise.reject(Object.assign(new Error('ENOSPC: no space left on device'), { code: 'ENOSPC' }));
      }
      return put(key, value);
    };
    const session = a.client.openSession({ sessionId: 'trainer', autoAck: false });
    const got: Trajectory[] = [];
    const reading = (async () => {
      try {
        for await (const t of session.trajectories()) {
          got.push(t);
          session.ack([{ taskId: t.taskId, sampleIndex: t.sampleIndex }]);
        }
      } catch {
        // ends with the server
      }
    })();
    await session.submit(mathTask('once', 1, 31));
    await eventually(() => got.length === 1, 'the trajectory (delivered although its write failed)', 60_000);
    expect(failed).toBe(true);
    await session.submit(mathTask('fence', 1, 32)); // its acceptance is fsynced after the ack
    await eventually(() => got.length === 2, 'the fence', 60_000);
    await session.submit(mathTask('fence2', 1, 33));
    await a.close();
    await reading;

    const b = await journaled(dir);
    const resumed = b.client.openSession({ sessionId: 'trainer', resume: true });
    await resumed.opened;
    resumed.close();
    const after: Trajectory[] = [];
    for await (const t of resumed.trajectories()) after.push(t);
    // The journal holds the ack of once/0 (the client has it and said so): it must not be run and delivered again.
    expect(after.map((t) => `${t.taskId}/${t.sampleIndex}`).filter((k) => k === 'once/0')).toEqual([]);
  }, 120_000);
});
