import { describe, expect, it } from 'vitest';
import { Trajectory, type RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { Session } from '../../src/contract/session.js';
import type { StreamWriter } from '../../src/contract/stream-writer.js';

/** Records what the session writes; stands in for the gRPC stream writer. */
function recorder(): { writer: StreamWriter<RolloutResponse>; sent: string[] } {
  const sent: string[] = [];
  const writer = {
    send: (m: RolloutResponse) => {
      if (m.kind?.$case === 'trajectory') sent.push(`${m.kind.value.taskId}#${m.kind.value.sampleIndex}`);
    },
  } as unknown as StreamWriter<RolloutResponse>;
  return { writer, sent };
}

const traj = (taskId: string, sampleIndex: number): Trajectory => Trajectory.fromPartial({ taskId, sampleIndex });

describe('Session', () => {
  it('delivers each trajectory once, re-sends only unacked ones on resume, and forgets fully acked tasks', () => {
    const session = new Session('s', false);
    const first = recorder();
    session.attach(first.writer, false);
    session.expect('a', 2);
    session.expect('b', 1);
    session.sink(traj('a', 0));
    session.sink(traj('a', 0)); // a re-submit's finished trajectory: deduped
    session.sink(traj('b', 0));
    expect(first.sent).toEqual(['a#0', 'b#0']);
    expect(session.pending).toBe(1);

    session.ack({ taskIds: [], trajectories: [{ taskId: 'b', sampleIndex: 0 }] });
    expect(session.rememberedTasks).toBe(1); // b is done and acked: forgotten
    session.detach(first.writer);
    session.sink(traj('a', 1)); // finishes while no stream is attached

    const second = recorder();
    expect(session.attach(second.writer, true)).toBe(2);
    expect(second.sent.sort()).toEqual(['a#0', 'a#1']);
    expect(session.pending).toBe(0);
    session.ack({ taskIds: ['a'], trajectories: [] });
    expect(session.rememberedTasks).toBe(0);
    expect(session.unackedCount).toBe(0);
  });

  it('owns a claimed task before it is accepted, and not after a rejection', () => {
    const session = new Session('s', true);
    session.claim('t');
    expect(session.owns('t')).toBe(true);
    session.unclaim('t');
    expect(session.owns('t')).toBe(false);
    session.claim('u');
    session.expect('u', 1);
    expect(session.owns('u')).toBe(true);
  });
});
