import { randomUUID } from 'node:crypto';
import { RolloutError } from '../errors.js';
import { Session } from './session.js';

/** Where session lifecycle is recorded (the durable journal). */
export interface SessionHooks {
  /** A session was created (not resumed). */
  opened?(sessionId: string): void;
  /** A session closed with everything acknowledged, or expired: nothing of it can be resumed any more. */
  ended?(sessionId: string): void;
}

/**
 * Open sessions by id. A session whose stream broke stays resumable for `ttlMs`; then it is dropped (its tasks
 * keep running and stay readable through GetTrajectory). Each session bounds its unacked trajectories to
 * `maxUnackedBytes` (see Session). Detached sessions together hold at most `maxDetachedBytes`: a client that fills
 * session after session and abandons each (fresh ids cost nothing) would otherwise make the server hold per-session
 * bound × sessions for the TTL; past it the oldest detached sessions are dropped as if expired (a resume of one is
 * NOT_FOUND, its tasks stay readable through GetTrajectory while retained).
 */
export class SessionManager {
  private readonly sessions = new Map<string, Session>();
  private readonly sweeper: NodeJS.Timeout;

  constructor(
    private readonly ttlMs: number,
    private readonly maxUnackedBytes: number = Number.POSITIVE_INFINITY,
    private readonly hooks: SessionHooks = {},
    /** Bytes (unacked + held) all detached sessions may hold together; past it the oldest detached are dropped. */
    private readonly maxDetachedBytes: number = Number.POSITIVE_INFINITY,
  ) {
    this.sweeper = setInterval(() => this.sweep(), Math.min(ttlMs, 60_000));
    this.sweeper.unref();
  }

  /**
   * Opens (or, with resume, re-opens) a session. Resuming an unknown id is NOT_FOUND, so a client learns that
   * its unacked trajectories are gone instead of waiting for them. Resuming a session still attached to a stream
   * is a takeover, not an error: that stream may be half-open (its client vanished without a FIN and keepalive has
   * not noticed yet), and refusing would lock the trainer out; `Session.attach` evicts the old stream. Opening an
   * attached id without resume stays ALREADY_EXISTS: two trainers picking the same id by mistake must not steal
   * each other's deliveries silently. Opening a detached (or ended) id without resume starts a new, clean session:
   * the earlier one's unacked trajectories are not its to receive (a trainer restarted with a fixed id that wants them
   * resumes). The `opened` hook makes the journal forget them too (Journal.sessionOpened), so a restart agrees.
   */
  open(sessionId: string, resume: boolean, stageEvents: boolean): Session {
    const id = sessionId || randomUUID();
    const existing = this.sessions.get(id);
    if (resume) {
      if (!existing) throw new RolloutError('not_found', `session "${id}" is unknown or expired; open it without resume`);
      existing.stageEvents = stageEvents;
      // A session restored from the journal counts towards maxDetachedBytes from its first resume on (see restore).
      return this.track(existing);
    }
    if (existing && existing.detachedAt === undefined) throw new RolloutError('already_exists', `session "${id}" is open on another stream`);
    const session = this.track(new Session(id, stageEvents, this.maxUnackedBytes));
    this.sessions.set(id, session);
    this.hooks.opened?.(id);
    return session;
  }

  /** Drops a session whose client finished cleanly. */
  close(session: Session): void {
    if (this.sessions.get(session.id) !== session) return;
    this.sessions.delete(session.id);
    this.hooks.ended?.(session.id);
  }

  /**
   * Creates a session rebuilt from the journal at start-up (the caller refills it): detached, so `resume` attaches
   * it; its TTL starts now.
   */
  restore(sessionId: string): Session {
    // Not tracked for maxDetachedBytes until it is resumed: after a crash every session is detached at once, and
    // dropping some before their trainers come back would lose what the journal kept for them (what a restart must
    // not do). They are bounded by the TTL, and by what the journal could hold.
    const session = new Session(sessionId, false, this.maxUnackedBytes);
    session.detachedAt = Date.now();
    this.sessions.set(sessionId, session);
    return session;
  }

  /** Totals over open sessions, for tests, metrics and the log. */
  stats(): { sessions: number; unackedBytes: number; heldBytes: number; held: number; outboxBytes: number } {
    const out = { sessions: this.sessions.size, unackedBytes: 0, heldBytes: 0, held: 0, outboxBytes: 0 };
    for (const session of this.sessions.values()) {
      out.unackedBytes += session.unackedBytes;
      out.heldBytes += session.heldBytes;
      out.held += session.heldCount;
      out.outboxBytes += session.outboxBytes;
    }
    return out;
  }

  get(sessionId: string): Session | undefined {
    return this.sessions.get(sessionId);
  }

  get size(): number {
    return this.sessions.size;
  }

  stop(): void {
    clearInterval(this.sweeper);
  }

  private track(session: Session): Session {
    if (Number.isFinite(this.maxDetachedBytes)) session.onDetachedBytes = () => this.boundDetached();
    return session;
  }

  /** Drops the longest-detached sessions while detached sessions together hold more than maxDetachedBytes. */
  private boundDetached(): void {
    let total = 0;
    const detached: Session[] = [];
    for (const session of this.sessions.values()) {
      // Untracked: restored from the journal and not resumed yet (see restore).
      if (session.detachedAt === undefined || session.onDetachedBytes === undefined) continue;
      detached.push(session);
      total += session.unackedBytes + session.heldBytes;
    }
    if (total <= this.maxDetachedBytes) return;
    detached.sort((a, b) => a.detachedAt! - b.detachedAt!);
    for (const session of detached) {
      if (total <= this.maxDetachedBytes) break;
      total -= session.unackedBytes + session.heldBytes;
      this.sessions.delete(session.id);
      this.hooks.ended?.(session.id);
    }
  }

  private sweep(): void {
    const now = Date.now();
    for (const [id, session] of this.sessions) {
      if (session.detachedAt !== undefined && now - session.detachedAt > this.ttlMs) {
        this.sessions.delete(id);
        this.hooks.ended?.(id);
      }
    }
  }
}
