import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startHarness, type Harness } from '../support/harness.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const python = `${root}.venv/bin/python`;

function run(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(python, args, { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('the Python example trainer, over the generated stubs, against a real server', () => {
  let h: Harness;
  beforeAll(async () => {
    if (!existsSync(python)) throw new Error(`${python} missing: run ./scripts/setup.sh`);
    h = await startHarness();
  });
  afterAll(async () => h?.close());

  it('receives every trajectory of every group exactly once with the invariants, and sees the bad spec rejected', async () => {
    const { code, stdout, stderr } = await run(['examples/python/train_loop.py', '--target', h.server.address, '--groups', '5', '--group-size', '4', '--seed', '3']);
    const last = stdout.trim().split('\n').at(-1) ?? '';
    expect(code, `${stderr}\n${stdout}`).toBe(0);
    const summary = JSON.parse(last) as {
      accepted: number;
      rejected: Record<string, { field: string; reason: string }>;
      trajectories: number;
      expected: number;
      missing: number;
      duplicated: number;
      violations: string[];
      statuses: Record<string, number>;
      rewards: Record<string, number[]>;
    };
    expect(summary.accepted).toBe(5);
    expect(summary.expected).toBe(20);
    expect(summary.trajectories).toBe(20);
    expect(summary.missing).toBe(0);
    expect(summary.duplicated).toBe(0);
    expect(summary.violations).toEqual([]);
    expect(summary.rejected['py-3-invalid']?.field).toBe('num_samples');
    expect(Object.keys(summary.statuses).every((s) => s === 'TRAJECTORY_STATUS_COMPLETED' || s === 'TRAJECTORY_STATUS_TRUNCATED')).toBe(true);
    expect(Object.keys(summary.rewards)).toHaveLength(5);
  });
});
