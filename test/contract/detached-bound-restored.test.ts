import { describe, expect, it } from 'vitest';
import { Trajectory, type RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';
import type { Attachment } from '../../src/contract/session.js';
import { SessionManager } from '../../src/contract/sessions.js';
import type { StreamWriter } from '../../src/contract/stream-writer.js';
import { parseConfig } from '../../src/config.js';
import { wireSafe } from '../../src/pipeline/wire-safe.js';

/** Stands in for a stream's writer: takes everything, records nothing. */
function attachment(): Attachment {
  const drop = (_m: RolloutResponse): void => undefined;
  return { writer: { send: drop, sendUrgent: drop } as unknown as StreamWriter<RolloutResponse>, evict: () => undefined };
}
const traj = (taskId: string): Trajectory => wireSafe(Trajectory.fromPartial({ taskId, sampleIndex: 0, error: 'x'.repeat(1000) }), 1 << 20);

describe('sessions.maxDetachedBytes and sessions restored after a restart', () => {
  it('never drops a session restored from the journal before its trainer resumed it; counts it once it did', () => {
    const manager = new SessionManager(60_000, Number.POSITIVE_INFINITY, {}, 500);
    try {
      // After a crash every session is detached at once, holding what the journal kept for it.
      const restored = manager.restore('restored');
      restored.expect('r', 1);
      restored.sink(traj('r'));
      const other = manager.restore('other');
      other.expect('o', 1);
      other.sink(traj('o'));
      expect(manager.get('restored')).toBeDefined();
      expect(manager.get('other')).toBeDefined();

      // A session of this process's life, detached over the bound: the bound applies to it.
      const fresh = manager.open('fresh', false, false);
      const freshStream = attachment();
      fresh.attach(freshStream, false);
      fresh.expect('f', 1);
      fresh.sink(traj('f'));
      fresh.detach(freshStream.writer);
      expect(manager.get('fresh')).toBeUndefined();
      expect(manager.get('restored')).toBeDefined();

      // Resumed, it is an ordinary session: detached again, it counts, and it is dropped past the bound.
      const resumed = manager.open('restored', true, false);
      const resumedStream = attachment();
      resumed.attach(resumedStream, true);
      resumed.detach(resumedStream.writer);
      expect(manager.get('restored')).toBeUndefined();
      expect(manager.get('other')).toBeDefined();
    } finally {
      manager.stop();
    }
  });

  it('refuses a bound below one session’s own (a trainer detached by a blip would be dropped at once), naming both', () => {
    expect(() => parseConfig({ sessions: { maxUnackedBytes: 2 << 20, maxDetachedBytes: 1 << 20 } })).toThrow(
      expect.objectContaining({ code: 'invalid_argument', field: 'sessions.maxDetachedBytes', message: expect.stringMatching(/maxDetachedBytes \(1048576\).*maxUnackedBytes \(2097152\)/) }),
    );
    expect(parseConfig({ sessions: { maxUnackedBytes: 1 << 20, maxDetachedBytes: 1 << 20 } }).sessions.maxDetachedBytes).toBe(1 << 20);
  });
});
