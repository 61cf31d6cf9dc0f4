import { describe, expect, it } from 'vitest';
import { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { TaskStore } from '../../src/pipeline/task-store.js';
import type { ResolvedTask } from '../../src/pipeline/task.js';

const task = (taskId: string, numSamples = 1, fingerprint = 'spec'): ResolvedTask => ({ taskId, numSamples, fingerprint }) as unknown as ResolvedTask;
const finished = (taskId: string, responseTokens: number): Trajectory =>
  Trajectory.fromPartial({ taskId, sampleIndex: 0, responseTokenIds: new Array<number>(responseTokens).fill(1) });

describe('TaskStore', () => {
  it('keeps at most `retain` finished tasks, dropping the oldest, never a running one', () => {
    const store = new TaskStore(2);
    store.add(task('running', 2));
    for (const id of ['a', 'b', 'c']) {
      store.add(task(id));
      store.record(finished(id, 1));
    }
    expect(store.get('a')).toBeUndefined();
    expect(store.get('b')).toBeDefined();
    expect(store.get('c')).toBeDefined();
    expect(store.get('running')).toBeDefined();
  });

  it('keeps finished trajectories within a byte budget, so long trajectories cannot exhaust memory', () => {
    const store = new TaskStore(1_000, 200_000);
    for (let i = 0; i < 20; i++) {
      store.add(task(`long-${i}`));
      store.record(finished(`long-${i}`, 4_000)); // ~96 KB each by the estimate
    }
    expect(store.retainedBytes).toBeLessThanOrEqual(200_000);
    expect(store.get('long-19')).toBeDefined();
    expect(store.get('long-0')).toBeUndefined();
  });

  it('tells a retry from a conflicting reuse of a task_id', () => {
    const store = new TaskStore(10);
    store.add(task('t', 1, 'spec-1'));
    expect(store.existing(task('t', 1, 'spec-1'))).toBeDefined();
    expect(() => store.existing(task('t', 1, 'spec-2'))).toThrow(/task_id/);
  });
});
