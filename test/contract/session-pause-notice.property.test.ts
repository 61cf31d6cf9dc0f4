import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { Trajectory, type RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { Session } from '../../src/contract/session.js';
import type { StreamWriter } from '../../src/contract/stream-writer.js';

// The session refuses new tasks while Session.deliveryPaused holds (unacked bytes at the bound, or trajectories held),
// and a client learns of that state only from DeliveryPaused notices. The notices used to follow the held queue alone:
// a session at its bound with nothing held refused submits its client had never been told of, and a Python caller
// waiting in submit() never acked what kept the pause (it sat 60 s, then failed). Whatever the order of finishing
// trajectories, acks, detaches, resumes and half-closes, the last notice an attached stream got says exactly what admission sees.

type Op =
  | { kind: 'finish'; size: number }
  | { kind: 'ack'; pick: number }
  | { kind: 'ackAll' }
  | { kind: 'reattach'; resume: boolean }
  | { kind: 'detach' }
  | { kind: 'halfClose' };

const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ kind: fc.constant('finish' as const), size: fc.integer({ min: 0, max: 300 }) }) },
  { weight: 4, arbitrary: fc.record({ kind: fc.constant('ack' as const), pick: fc.nat() }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'ackAll' as const }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('reattach' as const), resume: fc.boolean() }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'detach' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'halfClose' as const }) },
);

/** Records the notices a stream got (a test double of the gRPC stream writer). */
function stream(): { writer: StreamWriter<RolloutResponse>; said: boolean[] } {
  const said: boolean[] = [];
  const record = (m: RolloutResponse): void => {
    if (m.kind?.$case === 'deliveryPaused') said.push(!m.kind.value.resumed);
  };
  return { writer: { send: record, sendUrgent: record } as unknown as StreamWriter<RolloutResponse>, said };
}

describe('DeliveryPaused notices', () => {
  it('the last one an attached stream got always matches the state in which new tasks are refused, and says each change once', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 1500 }), fc.array(op, { maxLength: 60 }), (bound, ops) => {
        const session = new Session('s', false, bound);
        let current = stream();
        session.attach({ writer: current.writer, evict: () => undefined }, false);
        let attached = true;
        let halfClosed = false;
        const finished: string[] = [];
        let n = 0;
        for (const o of ops) {
          if (o.kind === 'finish') {
            const taskId = `t${n++}`;
            session.expect(taskId, 1);
            session.sink(Trajectory.fromPartial({ taskId, sampleIndex: 0, environment: 'x'.repeat(o.size) }));
            finished.push(taskId);
          } else if (o.kind === 'ack' && finished.length > 0) {
            const [taskId] = finished.splice(o.pick % finished.length, 1);
            session.ack({ taskIds: [], trajectories: [{ taskId: taskId!, sampleIndex: 0 }] });
          } else if (o.kind === 'ackAll') {
            session.ack({ taskIds: [], trajectories: finished.splice(0).map((taskId) => ({ taskId, sampleIndex: 0 })) });
          } else if (o.kind === 'detach') {
            session.detach(current.writer);
            attached = false;
            halfClosed = false;
          } else if (o.kind === 'halfClose') {
            // Acks applied after it stand for nothing real: the invariant must hold all the same. On a detached
            // stream (a cancelled call's iterator ends too) it changes nothing: held ones stay held for a resume.
            const held = session.heldCount;
            session.endOfAcks(current.writer);
            if (attached) halfClosed = true;
            else expect(session.heldCount).toBe(held);
          } else if (o.kind === 'reattach') {
            current = stream();
            session.attach({ writer: current.writer, evict: () => undefined }, o.resume);
            attached = true;
            halfClosed = false;
          }
          if (!attached) continue;
          // A half-closed client can send no ack: nothing may wait for one (the stream would never end).
          if (halfClosed) expect(session.heldCount).toBe(0);
          expect(current.said.at(-1) ?? false).toBe(session.deliveryPaused);
          for (let i = 1; i < current.said.length; i++) expect(current.said[i]).not.toBe(current.said[i - 1]);
        }
      }),
      { numRuns: 500 },
    );
  });
});
