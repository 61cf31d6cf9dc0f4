import { describe, expect, it } from 'vitest';
import { TrajectoryStatus as S } from '../../gen/ts/rollout/v1/rollout.js';
import { attemptTaskId, attemptsByRow, isRetryableStatus, parseAttempt, planRow, supersededTasks } from '../../src/cli/submit-attempts.js';

const row = 'ds-0123456789-7-a12345678901'; // a content hash that looks like "a" + digits

describe('attempts of a dataset row', () => {
  it('names attempt k >= 2 with a suffix a row id cannot end in, and parses it back', () => {
    expect(attemptTaskId(row, 1)).toBe(row);
    expect(attemptTaskId(row, 3)).toBe(`${row}-attempt3`);
    expect(parseAttempt(row)).toEqual({ rowTaskId: row, attempt: 1 });
    expect(parseAttempt(`${row}-attempt12`)).toEqual({ rowTaskId: row, attempt: 12 });
  });

  it('retries infrastructure failures only: never a policy outcome or an invalid task', () => {
    for (const s of [S.TRAJECTORY_STATUS_BACKEND_ERROR, S.TRAJECTORY_STATUS_SANDBOX_ERROR, S.TRAJECTORY_STATUS_ENVIRONMENT_ERROR, S.TRAJECTORY_STATUS_TIMEOUT, S.TRAJECTORY_STATUS_CANCELLED]) {
      expect(isRetryableStatus(s), S[s]).toBe(true);
    }
    for (const s of [S.TRAJECTORY_STATUS_COMPLETED, S.TRAJECTORY_STATUS_TRUNCATED, S.TRAJECTORY_STATUS_INVALID_TASK]) expect(isRetryableStatus(s), S[s]).toBe(false);
  });

  it('plans a row from what the output and the retried file hold', () => {
    const plan = (written: Record<string, number[]>, failed: string[], retried: Record<string, number[]>, maxAttempts: number) => {
      const map = (o: Record<string, number[]>) => new Map(Object.entries(o).map(([k, v]) => [k, new Set(v)]));
      return planRow(attemptsByRow(map(written), new Set(failed), map(retried)).get(row), 2, maxAttempts);
    };
    expect(plan({}, [], {}, 3)).toEqual({ kind: 'submit', attempt: 1 });
    expect(plan({ [row]: [0, 1] }, [], {}, 3)).toEqual({ kind: 'done' });
    expect(plan({ [row]: [0] }, [], {}, 3)).toEqual({ kind: 'submit', attempt: 1 }); // half a group: attach again
    expect(plan({ [row]: [0, 1] }, [row], {}, 3)).toEqual({ kind: 'submit', attempt: 2 });
    expect(plan({ [row]: [0, 1] }, [row], {}, 1)).toEqual({ kind: 'exhausted', attempt: 1 });
    expect(plan({}, [], { [row]: [0, 1], [`${row}-attempt2`]: [0, 1] }, 3)).toEqual({ kind: 'submit', attempt: 3 });
    expect(plan({}, [], { [row]: [0, 1] }, 1)).toEqual({ kind: 'exhausted', attempt: 1 });
    expect(plan({ [`${row}-attempt3`]: [0, 1], [row]: [0, 1] }, [row], { [`${row}-attempt2`]: [0, 1] }, 3)).toEqual({ kind: 'done' });
  });

  it('finds the groups a later attempt of their row supersedes', () => {
    const written = new Map([row, `${row}-attempt3`, 'ds-other-1-ffff'].map((id) => [id, new Set([0])]));
    expect(supersededTasks(written)).toEqual(new Set([row]));
  });
});
