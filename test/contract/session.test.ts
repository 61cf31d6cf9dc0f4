import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { Trajectory, type RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { Session, type Attachment } from '../../src/contract/session.js';
import { trajectoryBytes } from '../../src/contract/response-encode.js';
import { encodedTrajectory, wireSafe } from '../../src/pipeline/wire-safe.js';
import type { StreamWriter } from '../../src/contract/stream-writer.js';

/** Records what the session writes; stands in for the gRPC stream writer. */
function recorder(): Attachment & { sent: string[]; notices: { held: number; resumed: boolean }[]; evicted: string[] } {
  const sent: string[] = [];
  const notices: { held: number; resumed: boolean }[] = [];
  const evicted: string[] = [];
  const record = (m: RolloutResponse): void => {
    if (m.kind?.$case === 'trajectory') sent.push(`${m.kind.value.taskId}#${m.kind.value.sampleIndex}`);
    if (m.kind?.$case === 'deliveryPaused') notices.push({ held: m.kind.value.held, resumed: m.kind.value.resumed });
  };
  const writer = { send: record, sendUrgent: record } as unknown as StreamWriter<RolloutResponse>;
  return { writer, evict: (reason) => evicted.push(reason), sent, notices, evicted };
}

const traj = (taskId: string, sampleIndex: number, text = ''): Trajectory =>
  Trajectory.fromPartial({ taskId, sampleIndex, error: text });

describe('Session', () => {
  it('delivers each trajectory once, re-sends only unacked ones on resume, and forgets fully acked tasks', () => {
    const session = new Session('s', false);
    const first = recorder();
    session.attach(first, false);
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
    expect(session.attach(second, true)).toEqual({ redelivered: 2, tookOver: false });
    expect(second.sent.sort()).toEqual(['a#0', 'a#1']);
    expect(session.pending).toBe(0);
    session.ack({ taskIds: ['a'], trajectories: [] });
    expect(session.rememberedTasks).toBe(0);
    expect(session.unackedCount).toBe(0);
    expect(session.unackedBytes).toBe(0);
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

  it('holds trajectories past the unacked byte bound, says so, and sends them in order as acks free room', () => {
    const one = trajectoryBytes(traj('t', 1, 'x'.repeat(1000))); // sample 0 encodes 2 bytes shorter (proto3 default)
    const session = new Session('s', false, 2 * one);
    const stream = recorder();
    session.attach(stream, false);
    session.expect('t', 5);
    for (let i = 0; i < 5; i++) session.sink(traj('t', i, 'x'.repeat(1000)));
    expect(stream.sent).toEqual(['t#0', 't#1']);
    expect(session.unackedBytes).toBe(2 * one - 2);
    expect(session.heldCount).toBe(3);
    expect(stream.notices).toEqual([{ held: 1, resumed: false }]);
    expect(session.pending).toBe(0);

    session.ack({ taskIds: [], trajectories: [{ taskId: 't', sampleIndex: 0 }] });
    expect(stream.sent).toEqual(['t#0', 't#1', 't#2']);
    session.ack({ taskIds: ['t'], trajectories: [] }); // acks what was sent: 1 and 2
    expect(stream.sent).toEqual(['t#0', 't#1', 't#2', 't#3', 't#4']);
    // Nothing is held, but 3 and 4 fill the bound: still paused (new tasks are refused), so no 'resumed' yet.
    expect(session.deliveryPaused).toBe(true);
    expect(stream.notices).toEqual([{ held: 1, resumed: false }]);
    expect(session.rememberedTasks).toBe(1); // 3 and 4 are not acked yet
    session.ack({ taskIds: ['t'], trajectories: [] });
    expect(stream.notices).toEqual([{ held: 1, resumed: false }, { held: 0, resumed: true }]);
    expect(session.deliveryPaused).toBe(false);
    expect(session.rememberedTasks).toBe(0);
    expect(session.unackedBytes).toBe(0);
  });

  it('sends one trajectory larger than the whole bound when nothing else is unacked', () => {
    const session = new Session('s', false, 100);
    const stream = recorder();
    session.attach(stream, false);
    session.expect('big', 2);
    session.sink(traj('big', 0, 'y'.repeat(10_000)));
    session.sink(traj('big', 1, 'y'.repeat(10_000)));
    expect(stream.sent).toEqual(['big#0']);
    session.ack({ taskIds: [], trajectories: [{ taskId: 'big', sampleIndex: 0 }] });
    expect(stream.sent).toEqual(['big#0', 'big#1']);
  });

  it('a resume while attached takes the session over: the old stream is evicted, the new one gets what is unacked', () => {
    const session = new Session('s', false);
    const old = recorder();
    session.attach(old, false);
    session.expect('a', 1);
    session.sink(traj('a', 0));
    const fresh = recorder();
    expect(session.attach(fresh, true)).toEqual({ redelivered: 1, tookOver: true });
    expect(old.evicted).toHaveLength(1);
    expect(fresh.sent).toEqual(['a#0']);
    session.detach(old.writer); // the old stream's cleanup must not detach the new one
    expect(session.isAttached).toBe(true);
  });

  it('keeps unacked and held trajectories as their bytes, not their objects, and re-sends those bytes intact', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    /** A pipeline-made (wireSafe) trajectory of a long response: its token arrays are what a session must not pin. */
    const long = (sampleIndex: number): Trajectory => {
      const n = 20_000;
      const t = Trajectory.fromPartial({
        taskId: 'long',
        sampleIndex,
        responseTokenIds: Array.from({ length: n }, (_, i) => (i * 7919 + sampleIndex) % 150_000),
        responseMask: Array.from({ length: n }, () => 1),
        responseLogprobs: Array.from({ length: n }, (_, i) => -(i % 97) / 8),
      });
      return wireSafe(t, 1 << 30);
    };
    const sentBytes: Uint8Array[] = [];
    const bytesOfSent = (m: RolloutResponse): void => {
      if (m.kind?.$case === 'trajectory') sentBytes.push(encodedTrajectory(m.kind.value)!);
    };
    const attachment = (): Attachment => ({ writer: { send: bytesOfSent, sendUrgent: () => {} } as unknown as StreamWriter<RolloutResponse>, evict: () => {} });
    const one = trajectoryBytes(long(0));
    const session = new Session('s', false, one + 100); // room for one: the second is held
    const first = attachment();
    session.attach(first, false);
    session.expect('long', 2);
    const expected: Uint8Array[] = [];
    const alive: WeakRef<Trajectory>[] = [];
    const finish = (i: number): void => {
      const t = long(i);
      expected.push(encodedTrajectory(t)!.slice());
      alive.push(new WeakRef(t));
      session.sink(t);
    };
    finish(0);
    finish(1);
    expect(session.unackedCount).toBe(1);
    expect(session.heldCount).toBe(1);
    expect(session.unackedBytes).toBe(one);
    expect(sentBytes).toHaveLength(1);
    sentBytes.length = 0; // the writer took it (a transport would have written it by now)

    await new Promise((resolve) => setImmediate(resolve)); // WeakRefs made in a job are kept until it ends
    gc();
    expect(alive.map((ref) => ref.deref() === undefined)).toEqual([true, true]);

    session.detach(first.writer);
    expect(session.attach(attachment(), true).redelivered).toBe(1);
    session.ack({ taskIds: [], trajectories: [{ taskId: 'long', sampleIndex: 0 }] }); // frees room: the held one is sent
    expect(sentBytes.map((b, i) => Buffer.from(b).equals(Buffer.from(expected[i]!)))).toEqual([true, true]);
    expect(Trajectory.decode(sentBytes[1]!).responseTokenIds.slice(0, 3)).toEqual([1, 7920, 15839]);
  });
});
