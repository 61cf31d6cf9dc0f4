import { afterEach, describe, expect, it } from 'vitest';
import { CheckPool } from '../../src/environments/math/check-pool.js';
import type { CheckTask } from '../../src/environments/math/check-tasks.js';
import { TokenPool } from '../../src/tokens/token-pool.js';

// A task structured clone refuses (a function in it) cannot be posted to a thread: postMessage throws. The pools
// (src/workers/thread-pool.ts) used to leave such a task on its thread — the thread counted busy for good (or until
// taskTimeoutMs), the process ref'ed — and when the task was dispatched from a thread's answer the throw escaped the
// worker's 'message' listener: an uncaught exception, and the task's promise never settled.

/** Tasks of the TEST DOUBLE worker test/support/pool-test-worker.mjs. */
type TestTask = { op: 'echo'; value: unknown };

const SCRIPT = new URL('../support/pool-test-worker.mjs', import.meta.url);
const closers: (() => Promise<void>)[] = [];

function tokenPool(): TokenPool<TestTask, unknown> {
  // taskTimeoutMs 0: no bound that would free the thread after a minute.
  const p = new TokenPool<TestTask, unknown>({ script: SCRIPT, size: 1, taskTimeoutMs: 0 });
  closers.push(() => p.close());
  return p;
}

afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

describe('a task that cannot be sent to a thread', () => {
  it('fails with internal naming why, and the thread takes the next task', async () => {
    const pool = tokenPool();
    await pool.ready();
    await expect(pool.run({ op: 'echo', value: () => 1 })).rejects.toMatchObject({
      code: 'internal',
      message: expect.stringMatching(/could not be sent to its thread: .*could not be cloned/),
    });
    await expect(pool.run({ op: 'echo', value: 'next' })).resolves.toBe('next');
    expect(pool.stats()).toMatchObject({ workers: 1, busy: 0, queued: 0 });
  });

  it('queued behind a running task, fails when its turn comes (no uncaught exception) and the queue goes on', async () => {
    const pool = tokenPool();
    await pool.ready();
    // The one thread takes `first` at once; the next two wait, and are dispatched from its answer's 'message' listener.
    const first = pool.run({ op: 'echo', value: 'first' });
    const unsendable = pool.run({ op: 'echo', value: () => 1 });
    const after = pool.run({ op: 'echo', value: 'after' });
    await expect(first).resolves.toBe('first');
    await expect(unsendable).rejects.toMatchObject({ code: 'internal' });
    await expect(after).resolves.toBe('after');
  });

  it('is an environment_error for the answer checkers, never a verdict, and the checker goes on', async () => {
    const checks = new CheckPool({ size: 1 });
    closers.push(() => checks.close());
    const task = { kind: 'equivalence', predicted: 'x+1', reference: '1+x', extra: () => 1 } as CheckTask;
    await expect(checks.check(task)).rejects.toMatchObject({ code: 'environment_error', message: expect.stringMatching(/could not be sent/) });
    await expect(checks.check({ kind: 'equivalence', predicted: 'x+1', reference: '1+x' })).resolves.toMatchObject({ result: { equivalent: true } });
  });
});
