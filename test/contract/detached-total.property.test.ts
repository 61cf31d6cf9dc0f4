import fc from 'fast-check';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Trajectory, type RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';
import type { Attachment, Session } from '../../src/contract/session.js';
import { SessionManager } from '../../src/contract/sessions.js';
import type { StreamWriter } from '../../src/contract/stream-writer.js';
import { wireSafe } from '../../src/pipeline/wire-safe.js';

/**
 * sessions.maxDetachedBytes keeps a running total of what detached sessions hold (not a scan per change). Random
 * sequences of what streams and the pipeline do to sessions — open, resume (a take-over when attached), detach,
 * delivery (held past maxUnackedBytes), ack, close, restore from the journal, expiry — are checked after every step
 * against the total recomputed from the sessions the manager holds: a drift either way drops a trainer's session
 * early (the bound seems reached) or never bounds anything.
 */

/** Stands in for a stream's writer: takes everything, records nothing. */
function streamDouble(): Attachment {
  const drop = (_m: RolloutResponse): void => undefined;
  return { writer: { send: drop, sendUrgent: drop } as unknown as StreamWriter<RolloutResponse>, evict: () => undefined };
}

const TTL_MS = 60_000;
const IDS = ['a', 'b', 'c'];
const TASKS = ['t0', 't1'];
const SAMPLES = 3;

type Op =
  | { op: 'open'; id: string; resume: boolean }
  | { op: 'detach'; id: string }
  | { op: 'deliver'; id: string; task: string; sample: number; size: number }
  | { op: 'ack'; id: string; task: string; sample: number | undefined }
  | { op: 'close'; id: string }
  | { op: 'restore'; id: string }
  | { op: 'expire' };

const id = fc.constantFrom(...IDS);
const task = fc.constantFrom(...TASKS);
const sample = fc.integer({ min: 0, max: SAMPLES - 1 });
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ op: fc.constant('open' as const), id, resume: fc.boolean() }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('detach' as const), id }) },
  { weight: 5, arbitrary: fc.record({ op: fc.constant('deliver' as const), id, task, sample, size: fc.integer({ min: 0, max: 600 }) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('ack' as const), id, task, sample: fc.option(sample, { nil: undefined }) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('close' as const), id }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('restore' as const), id }) },
  { weight: 1, arbitrary: fc.constant({ op: 'expire' as const }) },
);

afterEach(() => {
  vi.useRealTimers();
});

describe('the detached-bytes running total (sessions.maxDetachedBytes)', () => {
  it('equals the recomputed total after any sequence of attach, detach, delivery, ack, take-over, close, restore and expiry', () => {
    fc.assert(
      fc.property(fc.array(opArb, { minLength: 10, maxLength: 80 }), fc.integer({ min: 400, max: 4_000 }), (ops, maxDetachedBytes) => {
        vi.useFakeTimers({ toFake: ['Date', 'setInterval', 'clearInterval'] });
        const manager = new SessionManager(TTL_MS, 1_500, {}, maxDetachedBytes);
        /** The stream attached to each session object, as the model knows it. */
        const streams = new Map<Session, Attachment>();
        /** Sessions restored from the journal and not resumed since: not counted (see SessionManager.restore). */
        const restored = new Set<Session>();
        try {
          for (const step of ops) {
            const session = step.op === 'expire' ? undefined : manager.get(step.id);
            switch (step.op) {
              case 'open': {
                let opened: Session;
                try {
                  opened = manager.open(step.id, step.resume, false);
                } catch {
                  break; // unknown on resume, or attached without resume
                }
                restored.delete(opened);
                const stream = streamDouble();
                opened.attach(stream, step.resume);
                streams.set(opened, stream);
                break;
              }
              case 'detach': {
                const stream = session && streams.get(session);
                if (session && stream) session.detach(stream.writer);
                break;
              }
              case 'deliver': {
                if (!session) break;
                session.expect(step.task, SAMPLES);
                session.sink(wireSafe(Trajectory.fromPartial({ taskId: step.task, sampleIndex: step.sample, error: 'x'.repeat(step.size) }), 1 << 20));
                break;
              }
              case 'ack': {
                // Acks arrive on a stream: only an attached session takes them (a restored one is refilled by acks).
                if (!session || (!session.isAttached && !restored.has(session))) break;
                session.ack(step.sample === undefined ? { taskIds: [step.task], trajectories: [] } : { taskIds: [], trajectories: [{ taskId: step.task, sampleIndex: step.sample }] });
                break;
              }
              case 'close': {
                if (session) manager.close(session);
                break;
              }
              case 'restore': {
                if (!session) restored.add(manager.restore(step.id));
                break;
              }
              case 'expire': {
                vi.advanceTimersByTime(2 * TTL_MS);
                break;
              }
            }
            let expected = 0;
            for (const name of IDS) {
              const s = manager.get(name);
              if (s && s.detachedAt !== undefined && !restored.has(s)) expected += s.unackedBytes + s.heldBytes;
            }
            const total = (manager as unknown as { detachedBytes: number }).detachedBytes;
            expect({ step, total }).toEqual({ step, total: expected });
            expect(total).toBeLessThanOrEqual(maxDetachedBytes);
          }
        } finally {
          manager.stop();
          vi.useRealTimers();
        }
      }),
      { numRuns: 400 },
    );
  });
});
