import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { asyncBufferFromFile, parquetReadObjects } from 'hyparquet';
import { afterEach, describe, expect, it } from 'vitest';
import { LogprobsMode } from '../../gen/ts/rollout/v1/backend.js';
import { Trajectory, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { openTrajectoryOutput } from '../../src/cli/submit-output.js';

/**
 * The data `rollout submit` writes, read back the way a trainer or a pass@k script reads it: a failed sample has no
 * reward (never 0, which is a wrong answer), a wrong answer has reward 0 (never "missing"), and what the server sent
 * about staleness and the logprobs mode survives into the Parquet file (also through a re-run that turns a finished
 * Parquet output back into its journal).
 */
const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function samples(): Trajectory[] {
  const base = Trajectory.fromPartial({ taskId: 'ds-x-0-y', groupId: 'ds-x-0-y', environment: 'math', numTurns: 1 });
  return [
    // A wrong answer: reward 0, a policy outcome; sampled at a stale policy version, flagged.
    { ...base, sampleIndex: 0, status: TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, reward: 0, responseTokenIds: [5, 6], responseMask: [1, 1], responseLogprobs: [Math.fround(-0.1), Math.fround(-2.5)], stale: true, stalenessRestarts: 2, logprobsMode: LogprobsMode.LOGPROBS_MODE_RAW },
    // An infrastructure failure: no policy outcome, a long error with a newline.
    { ...base, sampleIndex: 1, status: TrajectoryStatus.TRAJECTORY_STATUS_BACKEND_ERROR, error: `engine died\n${'x'.repeat(100_000)}` },
    { ...base, sampleIndex: 2, status: TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, reward: 1, responseTokenIds: [7], responseMask: [1], responseLogprobs: [Math.fround(-0.3)], logprobsMode: LogprobsMode.LOGPROBS_MODE_PROCESSED },
    { ...base, sampleIndex: 3, status: TrajectoryStatus.TRAJECTORY_STATUS_INVALID_TASK, error: 'instance.answer: required' },
  ];
}

async function readParquet(path: string): Promise<Record<string, unknown>[]> {
  return parquetReadObjects({ file: await asyncBufferFromFile(path) });
}

describe('rollout submit output data (review s44)', () => {
  it('JSONL: a wrong answer carries reward 0, a failed or invalid sample carries no reward', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rs44-'));
    dirs.push(dir);
    const path = join(dir, 'out.jsonl');
    const out = await openTrajectoryOutput(path);
    for (const t of samples()) out.write(t);
    await out.close(true);
    const lines = readFileSync(path, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.map((l) => [l.sampleIndex ?? 0, l.status, 'reward' in l ? l.reward : 'none'])).toEqual([
      [0, 'TRAJECTORY_STATUS_COMPLETED', 0],
      [1, 'TRAJECTORY_STATUS_BACKEND_ERROR', 'none'],
      [2, 'TRAJECTORY_STATUS_COMPLETED', 1],
      [3, 'TRAJECTORY_STATUS_INVALID_TASK', 'none'],
    ]);
  });

  it('Parquet: reward is null for a sample without a policy outcome; stale, staleness_restarts, logprobs_mode are columns, kept through a re-run', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rs44-'));
    dirs.push(dir);
    const path = join(dir, 'out.parquet');
    const out = await openTrajectoryOutput(path);
    for (const t of samples()) out.write(t);
    await out.close(true);
    const check = (rows: Record<string, unknown>[]): void => {
      expect(rows.map((r) => [r.sample_index, r.status, r.reward])).toEqual([
        [0, 'TRAJECTORY_STATUS_COMPLETED', 0],
        [1, 'TRAJECTORY_STATUS_BACKEND_ERROR', null],
        [2, 'TRAJECTORY_STATUS_COMPLETED', 1],
        [3, 'TRAJECTORY_STATUS_INVALID_TASK', null],
      ]);
      expect(rows.map((r) => [r.stale, r.staleness_restarts, r.logprobs_mode])).toEqual([
        [true, 2, 'LOGPROBS_MODE_RAW'],
        [false, 0, 'LOGPROBS_MODE_UNSPECIFIED'],
        [false, 0, 'LOGPROBS_MODE_PROCESSED'],
        [false, 0, 'LOGPROBS_MODE_UNSPECIFIED'],
      ]);
      // The float32 logprobs the proto carries, exactly; the error text whole.
      expect(rows[0]!.response_logprobs).toEqual([Math.fround(-0.1), Math.fround(-2.5)]);
      expect(rows[1]!.error).toBe(`engine died\n${'x'.repeat(100_000)}`);
    };
    check(await readParquet(path));
    // A re-run on the finished output turns it back into its journal and writes it again: nothing may be lost.
    const again = await openTrajectoryOutput(path);
    expect([...again.written.get('ds-x-0-y')!].sort()).toEqual([0, 1, 2, 3]);
    await again.close(true);
    check(await readParquet(path));
  });
});
