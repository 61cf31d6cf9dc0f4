import { afterEach, describe, expect, it } from 'vitest';
import { mathTask } from '../support/harness.js';
import { startServerHarness, TrajectoryReader, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

// Found by review (helper-49): the client paused the whole call once `highWater` trajectories waited unread, and the
// answers to submits (`accepted`) travel on the same call behind them - a trainer that submits its batch, awaiting each
// submit, before it reads hung for ever once highWater trajectories had finished first. The server's own bound
// (sessions.maxUnackedBytes: what a client has not acked, and it acks only what it read) bounds that queue anyway.

const harnesses: ServerHarness[] = [];
afterEach(async () => {
  await Promise.all(harnesses.splice(0).map((h) => h.close()));
});

describe('the TypeScript client\'s flow control', () => {
  it('answers a submit while highWater trajectories wait unread (the call is not paused under a pending submit)', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null } } });
    harnesses.push(h);
    const session = h.client.openSession({ sessionId: 'submit-before-read', highWater: 2 });
    await session.submit(mathTask('first', 1, 1));
    await session.submit(mathTask('second', 1, 2));
    // Both delivered to the client and unread: its queue is at highWater.
    await eventually(() => h.server.sessions.get('submit-before-read')?.unackedCount === 2, 'two trajectories sent, unread', 30_000);
    const third = await Promise.race([
      session.submit(mathTask('third', 1, 3)).then((a) => a.taskId),
      new Promise<string>((resolve) => setTimeout(() => resolve('no answer within 15 s'), 15_000)),
    ]);
    expect(third).toBe('third');
    const got = await new TrajectoryReader(session).take(3);
    expect(got.map((t) => t.taskId).sort()).toEqual(['first', 'second', 'third']);
  }, 120_000);
});
