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

describe('TaskStore byte accounting', () => {
  it('counts eval reports, transcripts and the spec, and running tasks as their samples finish', () => {
    const store = new TaskStore(1_000);
    const spec = task('group', 3, JSON.stringify({ instance: 'i'.repeat(10_000) }));
    store.add(spec);
    const specOnly = store.bytes;
    expect(specOnly).toBeGreaterThan(2 * 10_000);
    const report = { log: 'x'.repeat(1 << 20) };
    store.record(Trajectory.fromPartial({ taskId: 'group', sampleIndex: 0, evalReport: report, messages: [{ role: 'tool', content: 'y'.repeat(100_000) }] }));
    // Still running (1 of 3 done): counted anyway, and the 1 MiB report is in it.
    expect(store.bytes - specOnly).toBeGreaterThan((1 << 20) + 200_000);
    expect(store.retainedBytes).toBe(0);
    store.record(Trajectory.fromPartial({ taskId: 'group', sampleIndex: 1 }));
    store.record(Trajectory.fromPartial({ taskId: 'group', sampleIndex: 2 }));
    expect(store.retainedBytes).toBe(store.bytes);
    store.dropFinished();
    expect(store.bytes).toBe(0);
  });

  it('drops a finished task whose report alone is over the budget', () => {
    const store = new TaskStore(1_000, 1 << 20);
    store.add(task('huge-report'));
    store.record(Trajectory.fromPartial({ taskId: 'huge-report', sampleIndex: 0, evalReport: { log: 'z'.repeat(1 << 20) } }));
    expect(store.get('huge-report')).toBeUndefined();
    expect(store.bytes).toBe(0);
  });
});
