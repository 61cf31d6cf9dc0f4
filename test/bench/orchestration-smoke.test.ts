import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';

const run = promisify(execFile);
const BENCH = fileURLToPath(new URL('../../bench/orchestration.ts', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'rollout-orch-smoke-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/**
 * Keeps bench/orchestration.ts from rotting: every pass but the bubblewrap one at a tiny load, as the bench runs
 * (its own server and engine-double children), asserting the accounting it checks itself (exit 0: every trajectory
 * and request succeeded, nothing leaked, one engine request per turn) and that each figure the README describes is
 * in the results file. Timings are printed by the bench, never asserted here.
 */
describe('bench/orchestration (tiny load)', () => {
  it('runs every pass, finds no problem and writes each figure', async () => {
    const output = join(dir, 'orchestration.json');
    const args = ['--import', 'tsx', BENCH, '--trajectories', '120', '--concurrency', '60', '--warmup', '30', '--hold', '40',
      '--no-sandbox-pass', '--long-trajectories', '2', '--long-concurrency', '2', '--engine-bound-ms', '50', '--engine-bound-servers', '1,2', '--output', output];
    const { stdout } = await run(process.execPath, args, { timeout: 240_000, maxBuffer: 16 << 20 });
    const results = JSON.parse(readFileSync(output, 'utf8')) as { figures: Record<string, number>; problems: string[] };
    expect(results.problems).toEqual([]);
    const f = results.figures;
    expect(f.serverTrajectories).toBe(120);
    expect(f.directRequests).toBe(240); // 2 LLM turns per bench-calc trajectory, each replayed once per direct pass
    // The direct rate is the median of its passes.
    expect(f.directRequestsPerS).toBeGreaterThanOrEqual(f.directRequestsPerSSlowestPass!);
    expect(f.directRequestsPerS).toBeLessThanOrEqual(f.directRequestsPerSFastestPass!);
    for (const key of ['ratioServerTurnsToDirectRequests', 'serverCpuMicrosPerTurn', 'heapBytesPerInFlightTrajectory', 'longThreadsEventLoopDelayP99Ms',
      'longInlineEventLoopDelayP99Ms', 'engineBound50msRatio', 'engineBound50msServerCpuMicrosPerTurn', 'engineBound50ms2ServersRatio',
      'engineBound50ms2ServersServerCpuMicrosPerTurn']) {
      expect(f[key], key).toBeGreaterThan(0);
    }
    // Half the mean service time is a floor under every request's latency (the engine double answers no sooner),
    // so under each median too: a pass whose engine ignored its service time would be far below.
    expect(f.engineBound50msDirectLatencyP50Ms).toBeGreaterThanOrEqual(25);
    expect(f.engineBound50msTrajectoryLatencyP50Ms).toBeGreaterThanOrEqual(50);
    expect(f.engineBound50ms2ServersTrajectoryLatencyP50Ms).toBeGreaterThanOrEqual(50);
    // Every held trajectory was received unacked, and the session's bound counted each one's bytes.
    expect(f.unackedTrajectories).toBe(40);
    expect(f.countedBytesPerUnackedTrajectory).toBeGreaterThan(0);
    expect(stdout).toContain('engine-bound passes');
    expect(stdout).toContain('status: every trajectory and request succeeded');
  }, 300_000);
});
