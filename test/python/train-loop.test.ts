import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, type Harness } from '../support/harness.js';
import { PYTHON_RUNTIMES, ROOT, runPython, type PythonRuntime } from './runtimes.js';

interface Summary {
  accepted: number;
  rejected: Record<string, { field: string; reason: string }>;
  trajectories: number;
  expected: number;
  missing: number;
  duplicated: number;
  violations: string[];
  statuses: Record<string, number>;
  rewards: Record<string, number[]>;
}

// One server for every runtime; each run has its own seed, hence its own task and session ids.
const LEGS: (PythonRuntime & { seed: number })[] = PYTHON_RUNTIMES.map((runtime, i) => ({ ...runtime, seed: 3 + i }));

describe('the Python example trainer, over the generated stubs, against a real server', () => {
  let h: Harness;
  beforeAll(async () => {
    for (const { venv } of PYTHON_RUNTIMES) {
      if (!existsSync(`${ROOT}${venv}/bin/python`)) throw new Error(`${venv} missing: run ./scripts/setup.sh`);
    }
    h = await startHarness();
  });
  afterAll(async () => h?.close());

  it.each(LEGS)('on $name: receives every trajectory of every group exactly once with the invariants, and sees the bad spec rejected', async (leg) => {
    const args = ['examples/python/train_loop.py', '--target', h.server.address, '--groups', '5', '--group-size', '4', '--seed', String(leg.seed)];
    const { code, stdout, stderr } = await runPython(leg, args);
    const last = stdout.trim().split('\n').at(-1) ?? '';
    expect(code, `${leg.venv}: ${stderr}\n${stdout}`).toBe(0);
    const summary = JSON.parse(last) as Summary;
    expect(summary.accepted).toBe(5);
    expect(summary.expected).toBe(20);
    expect(summary.trajectories).toBe(20);
    expect(summary.missing).toBe(0);
    expect(summary.duplicated).toBe(0);
    expect(summary.violations).toEqual([]);
    expect(summary.rejected[`py-${leg.seed}-invalid`]?.field).toBe('num_samples');
    expect(Object.keys(summary.statuses).every((s) => s === 'TRAJECTORY_STATUS_COMPLETED' || s === 'TRAJECTORY_STATUS_TRUNCATED')).toBe(true);
    expect(Object.keys(summary.rewards)).toHaveLength(5);
  });
});
