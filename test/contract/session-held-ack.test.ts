import { describe, expect, it } from 'vitest';
import { Trajectory, type RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { MAX_ACK_ENTRIES, Session } from '../../src/contract/session.js';
import type { StreamWriter } from '../../src/contract/stream-writer.js';

// An ack is applied on the event loop. Each ref of a task with held trajectories (delivery paused) used to scan every
// held trajectory of the session: an ack of the most refs a message may list, against as many held, held the event
// loop for tens of seconds (quadratic). Applied in one pass over what is held, it takes milliseconds.

/** Records what the session writes; stands in for the gRPC stream writer (a test double). */
function recordingWriter(): { writer: StreamWriter<RolloutResponse>; notices: boolean[] } {
  const notices: boolean[] = [];
  const record = (m: RolloutResponse): void => {
    if (m.kind?.$case === 'deliveryPaused') notices.push(m.kind.value.resumed);
  };
  return { writer: { send: record, sendUrgent: record } as unknown as StreamWriter<RolloutResponse>, notices };
}

describe('an ack of many refs while many trajectories are held', () => {
  it('is applied in one pass: the acked held ones are dropped, the others stay, in order', () => {
    const n = Math.min(40_000, MAX_ACK_ENTRIES);
    const session = new Session('s', false, 1); // 1 byte: everything after the first trajectory is held
    const { writer, notices } = recordingWriter();
    session.attach({ writer, evict: () => undefined }, false);
    for (let i = 0; i < n; i++) {
      session.expect(`t${i}`, 2);
      session.sink(Trajectory.fromPartial({ taskId: `t${i}`, sampleIndex: 0 }));
    }
    expect(session.heldCount).toBe(n - 1);
    // Refs of samples not delivered (index 1) of every task, and of the held sample of every other task.
    const refs = Array.from({ length: n / 2 }, (_, i) => [{ taskId: `t${2 * i}`, sampleIndex: 1 }, { taskId: `t${2 * i + 1}`, sampleIndex: 0 }]).flat();
    const started = performance.now();
    session.ack({ taskIds: [], trajectories: refs });
    const ms = performance.now() - started;
    // Before the fix: ~16 s on this machine (40k x 40k); one pass takes well under 100 ms.
    expect(ms).toBeLessThan(3_000);
    expect(session.heldCount).toBe(n - 1 - n / 2);
    expect(notices).toEqual([false]);

    // What is left of the held queue is released in completion order once the unacked one is acked.
    session.ack({ taskIds: [], trajectories: [{ taskId: 't0', sampleIndex: 0 }] });
    expect(session.unackedCount).toBe(1);
    expect(session.heldCount).toBe(n - 2 - n / 2);
  });

  it('acking every held trajectory by reference empties the held queue; delivery resumes once, when the bound has room', () => {
    const session = new Session('s', false, 1);
    const { writer, notices } = recordingWriter();
    session.attach({ writer, evict: () => undefined }, false);
    for (let i = 0; i < 4; i++) {
      session.expect(`t${i}`, 1);
      session.sink(Trajectory.fromPartial({ taskId: `t${i}`, sampleIndex: 0 }));
    }
    session.ack({ taskIds: [], trajectories: [1, 2, 3].map((i) => ({ taskId: `t${i}`, sampleIndex: 0 })) });
    expect(session.heldCount).toBe(0);
    expect(notices).toEqual([false]); // t0 still fills the bound: new tasks are still refused, so still paused
    expect(session.rememberedTasks).toBe(1); // t1..t3 acked in full (never sent): forgotten
    session.ack({ taskIds: [], trajectories: [{ taskId: 't0', sampleIndex: 0 }] });
    expect(notices).toEqual([false, true]);
  });
});
