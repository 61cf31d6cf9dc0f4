import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { Trajectory, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { encodedTrajectory, wireSafe } from '../../src/pipeline/wire-safe.js';

const completed = (extra: Partial<Trajectory> = {}): Trajectory =>
  Trajectory.fromPartial({
    taskId: 't',
    sampleIndex: 1,
    groupId: 'g',
    environment: 'env',
    status: TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
    finishReason: 'answer',
    promptTokenIds: [1, 2, 3],
    responseTokenIds: [4, 5],
    responseMask: [1, 1],
    responseLogprobs: [-0.5, -0.25],
    reward: 1,
    rewardDetails: { correct: 1 },
    ...extra,
  });

describe('wireSafe', () => {
  it('keeps an encodable trajectory as it is and remembers its bytes', () => {
    const t = completed({ evalReport: { ok: true } });
    const safe = wireSafe(t, 64 << 20);
    expect(safe).toBe(t);
    expect(Trajectory.decode(encodedTrajectory(safe)!)).toEqual(Trajectory.decode(Trajectory.encode(t).finish()));
  });

  it('turns a report holding a bigint or a cycle into ENVIRONMENT_ERROR without the report, tokens kept', () => {
    const cyclic: Record<string, unknown> = { a: 1 };
    cyclic.self = cyclic;
    for (const report of [{ big: 10n }, cyclic]) {
      const safe = wireSafe(completed({ evalReport: report as Record<string, unknown> }), 64 << 20);
      expect(safe.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR);
      expect(safe.evalReport).toBeUndefined();
      expect(safe.reward).toBe(0);
      expect(safe.error).toMatch(/could not be encoded .*dropped eval_report/);
      expect(safe.responseTokenIds).toEqual([4, 5]);
      expect(Trajectory.decode(encodedTrajectory(safe)!).status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR);
    }
  });

  it('drops what is needed to fit the message limit, and keeps a failure status as it was', () => {
    const huge = completed({ responseTokenIds: new Array(100_000).fill(7), responseMask: new Array(100_000).fill(1), responseLogprobs: new Array(100_000).fill(-1) });
    const safe = wireSafe(huge, 64 * 1024);
    expect(safe.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR);
    expect(safe.responseTokenIds).toEqual([]);
    expect(safe.error).toContain('over the');
    expect(encodedTrajectory(safe)!.length).toBeLessThanOrEqual(64 * 1024);
    const failed = wireSafe({ ...huge, status: TrajectoryStatus.TRAJECTORY_STATUS_BACKEND_ERROR, error: 'backend_error: engine gone' }, 64 * 1024);
    expect(failed.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_BACKEND_ERROR);
    expect(failed.error).toContain('engine gone');
  });

  it('property: whatever the report and sizes, the result encodes within the limit and decodes', () => {
    const hostile = fc.oneof(fc.jsonValue(), fc.bigInt(), fc.constant(Number.NaN), fc.string({ minLength: 0, maxLength: 20_000 }), fc.func(fc.integer()));
    fc.assert(
      fc.property(fc.dictionary(fc.string({ maxLength: 8 }), hostile, { maxKeys: 4 }), fc.nat(30_000), fc.array(fc.string({ maxLength: 3_000 }), { maxLength: 8 }), (report, tokens, contents) => {
        const t = completed({
          evalReport: report,
          responseTokenIds: new Array(tokens).fill(3),
          responseMask: new Array(tokens).fill(0),
          responseLogprobs: new Array(tokens).fill(0),
          messages: contents.map((content) => ({ role: 'tool', content, name: '' })),
        });
        const safe = wireSafe(t, 64 * 1024);
        const bytes = encodedTrajectory(safe)!;
        expect(bytes.length).toBeLessThanOrEqual(64 * 1024);
        expect(Trajectory.decode(bytes).taskId).toBe('t');
      }),
      { numRuns: 60 },
    );
  });
});
