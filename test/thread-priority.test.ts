import { execFile } from 'node:child_process';
import { getPriority } from 'node:os';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { BELOW_NORMAL } from '../src/thread-priority.js';

const CHILD = fileURLToPath(new URL('./support/thread-priority-child.ts', import.meta.url));
const run = promisify(execFile);

interface ChildReport {
  pid: number;
  alreadyLow?: number;
  lowered?: number[];
  nices: Record<string, number | undefined>;
}

async function child(mode: string): Promise<ChildReport> {
  const { stdout } = await run(process.execPath, ['--import', 'tsx', CHILD, mode], { timeout: 60_000 });
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as ChildReport;
}

/** The nice value threads inherit here (the test runner's); lowering only happens below BELOW_NORMAL. */
const inherited = getPriority();

describe.skipIf(process.platform !== 'linux')('helper threads below the event loop (Linux: nice values are per thread)', () => {
  it('lowers every thread but the main one, and never raises one already lower', async () => {
    const r = await child('direct');
    const { [String(r.pid)]: main, ...others } = r.nices;
    expect(main).toBe(inherited); // the event loop keeps its priority
    expect(Object.keys(others).length).toBeGreaterThanOrEqual(2); // V8's workers and the worker thread at least
    for (const [tid, nice] of Object.entries(others)) {
      expect(nice, `thread ${tid}`).toBe(Number(tid) === r.alreadyLow ? 15 : Math.max(BELOW_NORMAL, inherited));
    }
    expect(r.lowered).not.toContain(r.alreadyLow);
    expect(r.lowered).not.toContain(r.pid);
    if (inherited < BELOW_NORMAL) expect(r.lowered!.length).toBe(Object.keys(others).length - 1);
  }, 90_000);

  it('does nothing when called from a worker thread (its own event loop and the other threads stay)', async () => {
    const r = await child('worker');
    expect(r.lowered).toEqual([]);
    for (const [tid, nice] of Object.entries(r.nices)) expect(nice, `thread ${tid}`).toBe(inherited);
  }, 90_000);

  it('is what a server does when it starts (config lowerHelperThreads, default on), and nothing when it is off', async () => {
    const [on, off] = await Promise.all([child('server-on'), child('server-off')]);
    const helpers = (r: ChildReport): (number | undefined)[] => Object.entries(r.nices).filter(([tid]) => Number(tid) !== r.pid).map(([, nice]) => nice);
    expect(on.nices[String(on.pid)]).toBe(inherited);
    expect(off.nices[String(off.pid)]).toBe(inherited);
    expect(helpers(on).length).toBeGreaterThan(0);
    expect(helpers(on).every((nice) => nice !== undefined && nice >= BELOW_NORMAL)).toBe(true);
    if (inherited < BELOW_NORMAL) expect(helpers(off).every((nice) => nice === inherited)).toBe(true);
  }, 120_000);
});
