import { describe, expect, it } from 'vitest';
import { Trajectory, type RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';
import type { Attachment } from '../../src/contract/session.js';
import { SessionManager } from '../../src/contract/sessions.js';
import type { StreamWriter } from '../../src/contract/stream-writer.js';
import { wireSafe } from '../../src/pipeline/wire-safe.js';

/** Stands in for a stream's writer: takes everything, records nothing. */
function attachment(): Attachment {
  const drop = (_m: RolloutResponse): void => undefined;
  return { writer: { send: drop, sendUrgent: drop } as unknown as StreamWriter<RolloutResponse>, evict: () => undefined };
}

describe('sessions.maxDetachedBytes with many detached sessions', () => {
  it('costs each detach and detached delivery the same however many sessions are detached, and keeps the newest within the bound', () => {
    const sessions = 30_000;
    const one = wireSafe(Trajectory.fromPartial({ taskId: 't', sampleIndex: 0, error: 'x'.repeat(100) }), 1 << 20);
    const manager = new SessionManager(600_000, Number.POSITIVE_INFINITY, {}, 1 << 30);
    try {
      const start = performance.now();
      for (let i = 0; i < sessions; i++) {
        const session = manager.open(`s-${i}`, false, false);
        const stream = attachment();
        session.attach(stream, false);
        session.expect('t', 2);
        session.detach(stream.writer);
        // Delivered while detached: kept for its resume, counted against the bound.
        session.sink({ ...one, sampleIndex: 0 });
        session.sink({ ...one, sampleIndex: 1 });
      }
      const ms = performance.now() - start;
      console.log(`${sessions} sessions detached with 2 deliveries each: ${ms.toFixed(0)} ms`);
      // A scan of every session per detach or delivery is ~1e9 steps here (tens of seconds); a running total is linear.
      expect(ms).toBeLessThan(10_000);
      expect(manager.size).toBe(sessions);
    } finally {
      manager.stop();
    }
  }, 120_000);

  it('drops the longest-detached first once the total passes the bound, and counts a resumed session out', () => {
    const one = wireSafe(Trajectory.fromPartial({ taskId: 't', sampleIndex: 0, error: 'x'.repeat(1000) }), 1 << 20);
    const each = (() => {
      const probe = new SessionManager(600_000);
      const s = probe.open('probe', false, false);
      s.expect('t', 1);
      s.sink(one);
      probe.stop();
      return s.unackedBytes;
    })();
    const bounded = new SessionManager(600_000, Number.POSITIVE_INFINITY, {}, 3 * each);
    try {
      const streams = new Map<string, Attachment>();
      for (const id of ['a', 'b', 'c', 'd']) {
        const session = bounded.open(id, false, false);
        const stream = attachment();
        streams.set(id, stream);
        session.attach(stream, false);
        session.expect('t', 1);
        session.sink(one);
        session.detach(stream.writer);
      }
      // Four detached holding one each, bound three: the longest-detached ("a") is dropped.
      expect(['a', 'b', 'c', 'd'].map((id) => bounded.get(id) !== undefined)).toEqual([false, true, true, true]);
      // "b" resumed leaves the detached total: "e" detaches beside c and d, at the bound, and nothing is dropped.
      const b = bounded.open('b', true, false);
      b.attach(attachment(), true);
      const e = bounded.open('e', false, false);
      const eStream = attachment();
      e.attach(eStream, false);
      e.expect('t', 1);
      e.sink(one);
      e.detach(eStream.writer);
      expect(['b', 'c', 'd', 'e'].map((id) => bounded.get(id) !== undefined)).toEqual([true, true, true, true]);
      // A new session replacing a detached one's id (opened without resume) takes the old one's bytes out of the total.
      const c2 = bounded.open('c', false, false);
      const c2Stream = attachment();
      c2.attach(c2Stream, false);
      c2.detach(c2Stream.writer);
      const f = bounded.open('f', false, false);
      const fStream = attachment();
      f.attach(fStream, false);
      f.expect('t', 1);
      f.sink(one);
      f.detach(fStream.writer);
      expect(['d', 'e', 'f'].map((id) => bounded.get(id) !== undefined)).toEqual([true, true, true]);
    } finally {
      bounded.stop();
    }
  });
});
