import { describe, expect, it, vi } from 'vitest';
import { TaskSpec, Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { TaskStore } from '../../src/pipeline/task-store.js';
import { encodedTrajectory } from '../../src/pipeline/wire-safe.js';
import { encodeTrajectory } from '../../src/pipeline/trajectory-encode.js';
import type { ResolvedTask } from '../../src/pipeline/task.js';

const task = (taskId: string, numSamples = 1, fingerprint = 'spec'): ResolvedTask => ({ taskId, numSamples, fingerprint }) as unknown as ResolvedTask;
// Ids of 3 varint bytes each (as most of a real vocabulary's), mask 1 byte, logprobs 4: ~8 bytes per token stored.
const finished = (taskId: string, responseTokens: number): Trajectory =>
  Trajectory.fromPartial({
    taskId,
    sampleIndex: 0,
    responseTokenIds: new Array<number>(responseTokens).fill(100_000),
    responseMask: new Array<number>(responseTokens).fill(1),
    responseLogprobs: new Array<number>(responseTokens).fill(-0.5),
  });

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
    const store = new TaskStore(1_000, 100_000);
    for (let i = 0; i < 20; i++) {
      store.add(task(`long-${i}`));
      store.record(finished(`long-${i}`, 4_000)); // ~32 KB each as stored
    }
    expect(store.retainedBytes).toBeLessThanOrEqual(100_000);
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
  it('gives back the bytes of tasks taken back (their acceptance could not be made durable), however many', () => {
    // A journal refusing writes (disk full) for a while: every task accepted meanwhile is taken back at once.
    const store = new TaskStore(100);
    for (let i = 0; i < 2_000; i++) {
      store.add(task(`refused-${i}`, 4, `spec of refused-${i}`));
      store.remove(`refused-${i}`);
    }
    expect(store.size).toBe(0);
    expect(store.bytes).toBe(0);
  });

  it('counts eval reports, transcripts and the spec, and running tasks as their samples finish', () => {
    const store = new TaskStore(1_000);
    const spec = task('group', 3, JSON.stringify({ instance: 'i'.repeat(10_000) }));
    store.add(spec);
    const specOnly = store.bytes;
    expect(specOnly).toBeGreaterThan(2 * 10_000);
    const report = { log: 'x'.repeat(1 << 20) };
    store.record(Trajectory.fromPartial({ taskId: 'group', sampleIndex: 0, evalReport: report, messages: [{ role: 'tool', content: 'y'.repeat(100_000) }] }));
    // Still running (1 of 3 done): counted anyway, and the 1 MiB report and the transcript are in it (as encoded).
    expect(store.bytes - specOnly).toBeGreaterThan((1 << 20) + 100_000);
    expect(store.retainedBytes).toBe(0);
    store.record(Trajectory.fromPartial({ taskId: 'group', sampleIndex: 1 }));
    store.record(Trajectory.fromPartial({ taskId: 'group', sampleIndex: 2 }));
    expect(store.retainedBytes).toBe(store.bytes);
    store.dropFinished();
    expect(store.bytes).toBe(0);
  });

  it('keeps a trajectory as its wire bytes and gives back what a client would decode, sent as those same bytes', async () => {
    const store = new TaskStore(10);
    store.add(task('kept'));
    const original = Trajectory.fromPartial({
      taskId: 'kept',
      sampleIndex: 0,
      promptTokenIds: [1, 2, 151_643],
      responseTokenIds: [7, 8],
      responseMask: [1, 0],
      responseLogprobs: [-0.1, 0],
      messages: [{ role: 'user', content: 'héllo' }],
      evalReport: { log: 'ok', passed: 3 },
    });
    store.record(original);
    const stored = store.get('kept')!.trajectories[0]!;
    expect(stored.bytes).toEqual(encodeTrajectory(original));
    const decode = vi.spyOn(Trajectory, 'decode');
    try {
      const back = stored.trajectory();
      // Sending it (the serializers look up its bytes) and a session's bookkeeping (identity fields) decode nothing.
      expect(encodedTrajectory(back)).toBe(stored.bytes);
      expect([back.taskId, back.sampleIndex, back.groupId, back.status]).toEqual(['kept', 0, '', original.status]);
      expect(decode).not.toHaveBeenCalled();
      expect(back.promptTokenIds).toEqual([1, 2, 151_643]);
      expect({ ...back }).toEqual({ ...original, responseLogprobs: [Math.fround(-0.1), 0] });
      expect(decode).toHaveBeenCalledTimes(1);
      expect(() => {
        (back as { error: string }).error = 'changed';
      }).toThrow(TypeError);
      expect(() => delete (back as { error?: string }).error).toThrow(TypeError);
      // An ordinary object to keys, JSON, `in` and promises (not a thenable); decoded once for all of it.
      const plain = Trajectory.decode(stored.bytes);
      expect(Object.keys(back)).toEqual(Object.keys(plain));
      expect(JSON.parse(JSON.stringify(back))).toEqual(JSON.parse(JSON.stringify(plain)));
      expect('responseTokenIds' in back && !('nope' in back)).toBe(true);
      expect(await Promise.resolve(back)).toBe(back);
      expect(decode).toHaveBeenCalledTimes(2); // the lazy object's one decode, and `plain` above
    } finally {
      decode.mockRestore();
    }
  });

  it('drops a finished task whose report alone is over the budget', () => {
    const store = new TaskStore(1_000, 1 << 20);
    store.add(task('huge-report'));
    store.record(Trajectory.fromPartial({ taskId: 'huge-report', sampleIndex: 0, evalReport: { log: 'z'.repeat(1 << 20) } }));
    expect(store.get('huge-report')).toBeUndefined();
    expect(store.bytes).toBe(0);
  });

  it('matches a re-submit of a task recovered unrunnable on its spec as sent, whatever the order of its map and Struct entries', () => {
    const store = new TaskStore(10);
    const spec = (metadata: Record<string, string>, instance: Record<string, unknown>): TaskSpec => TaskSpec.fromPartial({ taskId: 'gone-env', environment: 'removed', numSamples: 2, metadata, instance });
    const entry = store.addUnrunnable(spec({ a: '1', b: '2' }, { x: 1, y: [1, 2] }), 2);
    for (const i of [0, 1]) store.record({ ...finished('gone-env', 1), sampleIndex: i });
    expect(store.get('gone-env')).toBe(entry);
    expect(store.unrunnable(spec({ b: '2', a: '1' }, { y: [1, 2], x: 1 }))).toBe(entry);
    expect(store.unrunnable(spec({ a: '1', b: '3' }, { x: 1, y: [1, 2] }))).toBeUndefined();
    expect(store.unrunnable(TaskSpec.fromPartial({ taskId: 'other' }))).toBeUndefined();
    expect(entry.pending).toBe(0);
  });
});
