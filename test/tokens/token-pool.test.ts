import { readdirSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { TokenPool } from '../../src/tokens/token-pool.js';
import { eventually } from '../support/wait.js';

/** Tasks of the TEST DOUBLE worker test/support/pool-test-worker.mjs. */
type TestTask =
  | { op: 'echo'; value: unknown }
  | { op: 'throw'; code: string; message: string; field?: string }
  | { op: 'exit'; code: number }
  | { op: 'wait'; gate: SharedArrayBuffer };

const SCRIPT = new URL('../support/pool-test-worker.mjs', import.meta.url);
const pools: TokenPool<TestTask, unknown>[] = [];

function pool(options: { size?: number; maxQueued?: number; workerData?: unknown } = {}): TokenPool<TestTask, unknown> {
  const p = new TokenPool<TestTask, unknown>({ script: SCRIPT, ...options });
  pools.push(p);
  return p;
}

/** A task that blocks its thread until `release()`: what keeps a thread busy without timing. */
function gate(): { task: TestTask; release: () => void } {
  const buffer = new SharedArrayBuffer(4);
  return {
    task: { op: 'wait', gate: buffer },
    release: () => {
      const cell = new Int32Array(buffer);
      Atomics.store(cell, 0, 1);
      Atomics.notify(cell, 0);
    },
  };
}

/**
 * Ids of this process's OS threads (Linux), to see that a closed pool leaves none behind. By id, not by count: the
 * process may start threads of its own meanwhile (libuv's pool grows lazily; a count once saw 12 where 11 were before).
 */
function threadIds(): Set<string> {
  return new Set(readdirSync('/proc/self/task'));
}

afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.close()));
});

describe('TokenPool', () => {
  it('starts its threads with the first task and answers tasks in order of submission', async () => {
    const p = pool({ size: 2 });
    expect(p.stats().workers).toBe(0);
    const answers = await Promise.all([1, 2, 3, 4, 5].map((value) => p.run({ op: 'echo', value })));
    expect(answers).toEqual([1, 2, 3, 4, 5]);
    expect(p.stats()).toMatchObject({ workers: 2, busy: 0, queued: 0, completed: 5, crashes: 0 });
  });

  it("passes a task's failure on as a RolloutError with the same code, message and field", async () => {
    const p = pool({ size: 1 });
    await expect(p.run({ op: 'throw', code: 'invalid_argument', message: 'messages: bad', field: 'messages' })).rejects.toMatchObject({
      name: 'RolloutError',
      code: 'invalid_argument',
      message: 'messages: bad',
      field: 'messages',
    });
    expect(await p.run({ op: 'echo', value: 'still here' })).toBe('still here');
  });

  it('fails only the task of a thread that dies, replaces the thread, and runs the queued tasks on the new one', async () => {
    const p = pool({ size: 1 });
    await p.ready();
    const crashed = p.run({ op: 'exit', code: 7 });
    const queued = p.run({ op: 'echo', value: 'after the crash' });
    await expect(crashed).rejects.toMatchObject({ code: 'internal', message: expect.stringContaining('token worker exited with code 7') });
    expect(await queued).toBe('after the crash');
    expect(p.stats()).toMatchObject({ workers: 1, crashes: 1 });
  });

  it('refuses tasks beyond its queue bound with resource_exhausted', async () => {
    const p = pool({ size: 1, maxQueued: 1 });
    await p.ready();
    const { task, release } = gate();
    const running = p.run(task);
    const waiting = p.run({ op: 'echo', value: 'queued' });
    expect(p.stats()).toMatchObject({ busy: 1, queued: 1 });
    await expect(p.run({ op: 'echo', value: 'one too many' })).rejects.toMatchObject({ code: 'resource_exhausted' });
    release();
    expect(await running).toBe('released');
    expect(await waiting).toBe('queued');
  });

  it('drops a waiting task whose signal aborts, and gives a running one up at once', async () => {
    const p = pool({ size: 1 });
    await p.ready();
    const { task, release } = gate();
    const running = new AbortController();
    const runningTask = p.run(task, running.signal);
    const waiting = new AbortController();
    const waitingTask = p.run({ op: 'echo', value: 'never' }, waiting.signal);
    waiting.abort(new Error('cancelled by the test'));
    await expect(waitingTask).rejects.toMatchObject({ code: 'cancelled', message: 'cancelled by the test' });
    expect(p.stats().queued).toBe(0);
    running.abort();
    await expect(runningTask).rejects.toMatchObject({ code: 'cancelled' });
    release();
    expect(await p.run({ op: 'echo', value: 'next' })).toBe('next');
  });

  it('fails waiting tasks when its thread cannot start, instead of leaving them to their deadlines', async () => {
    const p = pool({ size: 1, workerData: { failInit: true } });
    await expect(p.run({ op: 'echo', value: 1 })).rejects.toMatchObject({ code: 'failed_precondition', message: expect.stringContaining('no model here') });
  });

  it('on close fails waiting and running tasks with unavailable, refuses new ones and leaves no thread behind', async () => {
    const before = threadIds();
    const p = pool({ size: 2 });
    await p.ready();
    // The pool's two threads are among those started since (with whatever else the process started meanwhile).
    const started = [...threadIds()].filter((tid) => !before.has(tid));
    expect(started.length).toBeGreaterThanOrEqual(2);
    const first = gate();
    const second = gate();
    const tasks = Promise.allSettled([p.run(first.task), p.run(second.task), p.run({ op: 'echo', value: 'never' })]);
    const closed = p.close();
    first.release();
    second.release();
    await closed;
    for (const outcome of await tasks) expect(outcome).toMatchObject({ status: 'rejected', reason: { code: 'unavailable' } });
    await expect(p.run({ op: 'echo', value: 1 })).rejects.toMatchObject({ code: 'unavailable' });
    expect(p.stats()).toMatchObject({ workers: 0, busy: 0, queued: 0 });
    // Its two threads are gone: at least two of those started with it no longer exist.
    await eventually(() => [...threadIds()].filter((tid) => started.includes(tid)).length <= started.length - 2, 'the pool\'s threads to end', 5_000);
  });
});
