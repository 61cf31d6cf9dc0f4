import { afterEach, describe, expect, it } from 'vitest';
import { TokenPool, type TokenPoolOptions } from '../../src/tokens/token-pool.js';

/**
 * TokenPool's recovery from threads that never answer or never start, on real threads (TEST DOUBLES
 * test/support/pool-test-worker.mjs and dies-while-loading-worker.mjs). Without it, as many stuck tasks as threads
 * left every later large token task waiting until its trajectory's own timeout, and a thread dying while loading
 * was respawned in a tight loop (each reloading the tokenizer) while the waiting tasks hung.
 */
type TestTask =
  | { op: 'echo'; value: unknown }
  | { op: 'thread' }
  | { op: 'wait' | 'spin'; gate: SharedArrayBuffer };

const WORKER = new URL('../support/pool-test-worker.mjs', import.meta.url);
const DIES_WHILE_LOADING = new URL('../support/dies-while-loading-worker.mjs', import.meta.url);
const pools: TokenPool<TestTask, unknown>[] = [];
const gates: SharedArrayBuffer[] = [];

function pool(options: Partial<TokenPoolOptions> = {}): TokenPool<TestTask, unknown> {
  const p = new TokenPool<TestTask, unknown>({ script: WORKER, ...options });
  pools.push(p);
  return p;
}

/** A task that holds its thread (blocked, or busy in a loop) until the test ends: a thread stuck in it. */
function stuck(op: 'wait' | 'spin' = 'wait'): TestTask & { gate: SharedArrayBuffer } {
  const gate = new SharedArrayBuffer(4);
  gates.push(gate);
  return { op, gate };
}

function release(gate: SharedArrayBuffer): void {
  const cell = new Int32Array(gate);
  Atomics.store(cell, 0, 1);
  Atomics.notify(cell, 0);
}

afterEach(async () => {
  for (const gate of gates.splice(0)) release(gate);
  await Promise.all(pools.splice(0).map((p) => p.close()));
});

describe('TokenPool with a thread stuck in a task', () => {
  it('stops and replaces threads stuck in tasks their callers gave up, so the tasks queued behind them run', async () => {
    const p = pool({ size: 2, abandonedTaskGraceMs: 100 });
    await p.ready();
    const before = await Promise.all([p.run({ op: 'thread' }), p.run({ op: 'thread' })]);
    const callers = [new AbortController(), new AbortController()];
    const given = callers.map((c) => p.run(stuck(), c.signal));
    const queued = p.run({ op: 'thread' });
    expect(p.stats()).toMatchObject({ busy: 2, queued: 1 });
    for (const c of callers) c.abort(new Error('run timeout'));
    for (const task of given) await expect(task).rejects.toMatchObject({ code: 'cancelled', message: 'run timeout' });
    expect(before).not.toContain(await queued);
    expect(p.stats()).toMatchObject({ workers: 2, busy: 0, queued: 0, completed: 3, crashes: 0, reclaimed: 2 });
  });

  it('keeps a thread that ends a given-up task within the grace (no tokenizer reload), dropping its answer', async () => {
    const p = pool({ size: 1, abandonedTaskGraceMs: 30_000 });
    await p.ready();
    const first = await p.run({ op: 'thread' });
    const task = stuck();
    const caller = new AbortController();
    const given = p.run(task, caller.signal);
    caller.abort(new Error('cancelled by the trainer'));
    await expect(given).rejects.toMatchObject({ code: 'cancelled', message: 'cancelled by the trainer' });
    const next = p.run({ op: 'thread' });
    release(task.gate);
    expect(await next).toBe(first);
    expect(p.stats()).toMatchObject({ workers: 1, busy: 0, completed: 3, reclaimed: 0 });
  });

  it('fails a task that overruns taskTimeoutMs with internal, replaces its thread and runs the queued tasks', async () => {
    const p = pool({ size: 1, taskTimeoutMs: 300 });
    await p.ready();
    const first = await p.run({ op: 'thread' });
    const overrun = p.run(stuck('spin'));
    const queued = p.run({ op: 'thread' });
    await expect(overrun).rejects.toMatchObject({ code: 'internal', message: expect.stringContaining('longer than 300 ms') });
    expect(await queued).not.toBe(first);
    expect(p.stats()).toMatchObject({ workers: 1, busy: 0, queued: 0, completed: 2, crashes: 0, reclaimed: 1 });
  });

  it('refuses a deadline setTimeout cannot keep', () => {
    expect(() => pool({ taskTimeoutMs: -1 })).toThrow(expect.objectContaining({ code: 'invalid_argument', field: 'taskTimeoutMs' }));
    expect(() => pool({ abandonedTaskGraceMs: 2 ** 31 })).toThrow(expect.objectContaining({ code: 'invalid_argument', field: 'abandonedTaskGraceMs' }));
  });
});

describe('TokenPool with a thread that dies while loading', () => {
  it('fails the waiting tasks and ready() at once, and retries with a back-off rather than in a loop', async () => {
    const p = pool({ script: DIES_WHILE_LOADING, size: 1 });
    const ready = p.ready();
    const task = p.run({ op: 'echo', value: 1 });
    const failed = { code: 'failed_precondition', message: expect.stringContaining('exited with code 3 while loading') };
    await expect(ready).rejects.toMatchObject(failed);
    await expect(task).rejects.toMatchObject(failed);
    // Retries at 0.5 s and 1.5 s (the back-off doubles); respawning at once started ~20 threads in this time.
    await new Promise((r) => setTimeout(r, 1_200));
    expect(p.stats().crashes).toBeLessThanOrEqual(3);
  });

  it('starts again once a thread loads, after the back-off', async () => {
    const starts = new SharedArrayBuffer(4);
    const p = pool({ script: DIES_WHILE_LOADING, size: 1, workerData: { starts, deaths: 2 } });
    const t0 = performance.now();
    await expect(p.run({ op: 'echo', value: 1 })).rejects.toMatchObject({ code: 'failed_precondition' });
    await expect(p.ready()).rejects.toMatchObject({ code: 'failed_precondition' }); // the retry after 0.5 s dies too
    await p.ready(); // the one after another 1 s loads
    expect(performance.now() - t0).toBeGreaterThanOrEqual(1_400);
    expect(await p.run({ op: 'echo', value: 'back' })).toBe('back');
    expect(p.stats()).toMatchObject({ workers: 1, crashes: 2 });
  });
});
