import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { CheckPool } from '../../src/environments/math/check-pool.js';
import type { CheckTask } from '../../src/environments/math/check-tasks.js';
import { TokenPool } from '../../src/tokens/token-pool.js';
import { DEFAULT_START_TIMEOUT_MS } from '../../src/workers/thread-pool.js';

// A thread whose start never ends — it neither answers ready nor exits: a module import that hangs, a top-level await
// that never settles, a tokenizer read stuck on a hung NFS mount — used to leave every task waiting until its caller's
// own signal and ready() waiting for ever (src/workers/thread-pool.ts): in the server every trajectory timed out in
// token work with no cause naming the pool. Now a thread not ready within the spec's startTimeoutMs is terminated
// and its start fails like an init error: what waits fails naming the bound, and the start is retried after the pause.

/** Tasks of the TEST DOUBLE worker test/support/pool-test-worker.mjs (which the hanging double becomes once it starts). */
type TestTask = { op: 'echo'; value: unknown };

const HANGS = new URL('../support/hangs-while-loading-worker.mjs', import.meta.url);
const CHILD = fileURLToPath(new URL('./review-s41-start-timeout-child.ts', import.meta.url));
const closers: (() => Promise<void>)[] = [];

afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

function tokenPool(workerData: Record<string, unknown>, options: { size?: number; startTimeoutMs?: number } = {}): TokenPool<TestTask, unknown> {
  const pool = new TokenPool<TestTask, unknown>({ script: HANGS, workerData, size: 1, taskTimeoutMs: 0, ...options });
  closers.push(() => pool.close());
  return pool;
}

/** Counts the double's starts (index 0) and whether one went on to start (index 1). */
function counter(): { sab: SharedArrayBuffer; starts: () => number; startedOn: () => boolean } {
  const sab = new SharedArrayBuffer(8);
  const view = new Int32Array(sab);
  return { sab, starts: () => Atomics.load(view, 0), startedOn: () => Atomics.load(view, 1) === 1 };
}

/** The promise, with its rejection marked handled: the test asserts it after awaiting something else. */
function handled<T>(promise: Promise<T>): Promise<T> {
  promise.catch(() => undefined);
  return promise;
}

const notReady = (ms: number) => expect.stringMatching(new RegExp(`could not start: it did not become ready within ${ms} ms`));

describe('a token thread whose start never ends', () => {
  it.each(['await', 'block'])('(%s) fails ready() and the waiting tasks, naming the start bound, and is terminated', { timeout: 15_000 }, async (hang) => {
    const pool = tokenPool({ hang }, { size: 2, startTimeoutMs: 300 });
    const started = Date.now();
    const ready = handled(pool.ready());
    const task = handled(pool.run({ op: 'echo', value: 'x' }));
    await expect(ready).rejects.toMatchObject({ code: 'failed_precondition', message: notReady(300) });
    await expect(task).rejects.toMatchObject({ code: 'failed_precondition', message: notReady(300) });
    expect(Date.now() - started).toBeLessThan(5_000);
    // Both threads let go (terminated; the second's bound fires just after the first's), none counted as a crash.
    await vi.waitFor(() => expect(pool.stats()).toMatchObject({ workers: 0, busy: 0, queued: 0, crashes: 0 }), { timeout: 3_000 });
  });

  it('(read stuck in the kernel) fails what waits at the bound though terminate() cannot end the thread yet', { timeout: 15_000 }, async () => {
    // A read of a FIFO nobody writes blocks in the kernel, as a read of a hung NFS mount does: terminate() takes
    // effect only when it returns, so the pool must fail the waiters without awaiting the thread's end.
    const dir = mkdtempSync(join(tmpdir(), 'review-s41-fifo-'));
    const fifo = join(dir, 'model.json');
    execFileSync('mkfifo', [fifo]);
    // Only the first thread reads it (a retry started before the pool is closed starts normally).
    const pool = tokenPool({ hang: 'read', path: fifo, hangs: 1, starts: counter().sab }, { startTimeoutMs: 300 });
    // Ends the read (EOF), so the terminated thread can end and the pool's close() return: a writer process whose open
    // blocks until a reader comes (the thread, however late it gets to its read on a loaded box), then exits. An open
    // with O_NONBLOCK instead was a no-op when the thread had not opened the FIFO yet, and the thread then blocked for
    // good (the test process could not exit: terminate() and process.exit wait for the read).
    let writer: Promise<void> | undefined;
    let writerPid: number | undefined;
    const release = (): Promise<void> => {
      if (!writer) {
        const child = spawn('sh', ['-c', 'exec 3>"$1"', 'sh', fifo], { stdio: 'ignore' });
        writerPid = child.pid;
        writer = new Promise((resolve) => child.on('exit', () => resolve()));
      }
      return writer;
    };
    closers.push(async () => {
      // Also when the test failed before its release. The writer ends once the thread has the FIFO open; a thread
      // terminated before it got to its read never opens it: the writer is then killed (by its pid) after a while.
      const ended = await Promise.race([release().then(() => true), new Promise<false>((r) => setTimeout(() => r(false), 10_000))]);
      if (!ended && writerPid !== undefined) process.kill(writerPid, 'SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    });
    const task = handled(pool.run({ op: 'echo', value: 'x' }));
    await expect(task).rejects.toMatchObject({ code: 'failed_precondition', message: notReady(300) });
    expect(pool.stats()).toMatchObject({ workers: 0, queued: 0 });
    void release();
  });

  it('is retried after the pause, and the next thread that starts serves the tasks', { timeout: 15_000 }, async () => {
    const c = counter();
    const pool = tokenPool({ hang: 'await', hangs: 1, starts: c.sab }, { startTimeoutMs: 300 });
    await expect(pool.ready()).rejects.toMatchObject({ message: notReady(300) });
    // Asked during the pause: waits for the retried thread (started after 0.5 s), which is ready.
    await expect(pool.run({ op: 'echo', value: 'after' })).resolves.toBe('after');
    expect(c.starts()).toBe(2);
    await expect(pool.ready()).resolves.toBeUndefined();
  });

  it('a slow start within the bound is unaffected', { timeout: 15_000 }, async () => {
    const c = counter();
    const pool = tokenPool({ delayMs: 600, starts: c.sab }, { startTimeoutMs: 3_000 });
    await expect(pool.ready()).resolves.toBeUndefined();
    await expect(pool.run({ op: 'echo', value: 'slow' })).resolves.toBe('slow');
    expect(c.starts()).toBe(1);
    expect(pool.stats()).toMatchObject({ workers: 1, crashes: 0 });
  });

  it('a ready that arrives after the bound fired is not used: the thread stays let go', { timeout: 15_000 }, async () => {
    const c = counter();
    const pool = tokenPool({ delayMs: 0, starts: c.sab }, { startTimeoutMs: 300 });
    const ready = handled(pool.ready());
    // Block the event loop past the bound while the thread starts and posts its ready, from a setImmediate (the loop's
    // check phase): its next turn runs the expired start timer (timers phase) before it reads the ready (poll phase).
    await new Promise<void>((resolve) =>
      setImmediate(() => {
        const from = Date.now();
        while (!c.startedOn() || Date.now() - from < 600);
        const posted = Date.now();
        while (Date.now() - posted < 300); // time for pool-test-worker.mjs to load and post ready
        resolve();
      }),
    );
    await expect(ready).rejects.toMatchObject({ message: notReady(300) });
    expect(pool.stats()).toMatchObject({ workers: 0 });
    // The next task waits for the retry, a new thread.
    await expect(pool.run({ op: 'echo', value: 'next' })).resolves.toBe('next');
    expect(c.starts()).toBe(2);
    expect(pool.stats()).toMatchObject({ workers: 1, crashes: 0 });
  });

  it.each(['await', 'block'])('(%s) close() during the start ends at once and fails what waits', { timeout: 15_000 }, async (hang) => {
    const pool = tokenPool({ hang }); // default bound: a minute
    const ready = handled(pool.ready());
    const task = handled(pool.run({ op: 'echo', value: 'x' }));
    await new Promise((resolve) => setTimeout(resolve, 200));
    const started = Date.now();
    await pool.close();
    expect(Date.now() - started).toBeLessThan(3_000);
    await expect(ready).rejects.toMatchObject({ code: 'unavailable', message: 'token workers are shutting down' });
    await expect(task).rejects.toMatchObject({ code: 'unavailable', message: 'token workers are shutting down' });
  });

  it('a process that gave up on the pool (never closed) ends at once: the start timer keeps nothing alive', { timeout: 30_000 }, async () => {
    expect(DEFAULT_START_TIMEOUT_MS).toBeGreaterThanOrEqual(30_000);
    const started = Date.now();
    const child = spawn(process.execPath, ['--import', 'tsx', CHILD, 'await'], { stdio: ['ignore', 'pipe', 'pipe'] });
    // A regression (the process kept alive by the timer) must not leave the child behind when the test times out.
    closers.push(async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
    expect({ code, err }).toEqual({ code: 0, err: '' });
    expect(out).toMatch(/aborted|timeout/i);
    expect(Date.now() - started).toBeLessThan(20_000);
  });
});

describe('an answer checker thread whose start never ends', () => {
  it('fails the check as environment_error naming the bound, never a verdict', { timeout: 15_000 }, async () => {
    const checks = new CheckPool({ size: 1, script: HANGS, startTimeoutMs: 300 });
    closers.push(() => checks.close());
    const task: CheckTask = { kind: 'equivalence', predicted: 'x^2+2x+1', reference: '(x+1)^2' };
    await expect(checks.check(task)).rejects.toMatchObject({
      code: 'environment_error',
      message: 'the answer checker thread could not start: it did not become ready within 300 ms; it was terminated',
    });
  });

  it('refuses a start bound that is not a whole number of ms', () => {
    expect(() => new CheckPool({ startTimeoutMs: -1 })).toThrow(/startTimeoutMs/);
    expect(() => new TokenPool({ script: HANGS, startTimeoutMs: 1.5 })).toThrow(/startTimeoutMs/);
  });
});
