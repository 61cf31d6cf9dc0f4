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
  /**
   * Detached sessions counted against maxDetachedBytes, with the bytes each was counted at, in the order they detached
   * (a session that attaches leaves, one that detaches again goes last): the longest-detached come first.
   */
  private readonly detached = new Map<Session, number>();
  /** The bytes of {@link detached}, kept as they change: a scan of every session per detached delivery was quadratic. */
  private detachedBytes = 0;
  private readonly sweeper: NodeJS.Timeout;

  constructor(
    private readonly ttlMs: number,
    private readonly maxUnackedBytes: number = Number.POSITIVE_INFINITY,
    private readonly hooks: SessionHooks = {},
    /** Bytes (unacked + held) all detached sessions may hold together; past it the oldest detached are dropped. */
    private readonly maxDetachedBytes: number = Number.POSITIVE_INFINITY,
    /** Sessions held at once (attached or detached); opening one more is RESOURCE_EXHAUSTED (sessions.maxOpen). */
    private readonly maxOpen: number = Number.POSITIVE_INFINITY,
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
    // Each session may hold maxUnackedBytes, and nothing tells one trainer's sessions from another's: the count is
    // bounded server-wide. A new session taking an ended one's id replaces it and adds none.
    if (!existing && this.sessions.size >= this.maxOpen) {
      throw new RolloutError('resource_exhausted', `the server holds ${this.sessions.size} sessions, the most it may (sessions.maxOpen): resume one of yours, or close sessions you no longer use (a detached one is held for sessions.ttlMs)`);
    }
    if (existing) this.uncount(existing);
    const session = this.track(new Session(id, stageEvents, this.maxUnackedBytes));
    this.sessions.set(id, session);
    this.hooks.opened?.(id);
    return session;
  }

  /** Drops a session whose client finished cleanly. */
  close(session: Session): void {
    if (this.sessions.get(session.id) !== session) return;
    this.sessions.delete(session.id);
    this.uncount(session);
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
    if (Number.isFinite(this.maxDetachedBytes)) session.onDetachedBytes = () => this.detachedChanged(session);
    return session;
  }

  /**
   * Keeps the running total of what detached sessions hold as `session` attaches, detaches or gains bytes, and drops
   * the longest-detached sessions while the total is over maxDetachedBytes.
   */
  private detachedChanged(session: Session): void {
    if (session.detachedAt === undefined || this.sessions.get(session.id) !== session) {
      this.uncount(session);
      return;
    }
    const bytes = session.unackedBytes + session.heldBytes;
    this.detachedBytes += bytes - (this.detached.get(session) ?? 0);
    this.detached.set(session, bytes);
    if (this.detachedBytes <= this.maxDetachedBytes) return;
    for (const [oldest, counted] of this.detached) {
      if (this.detachedBytes <= this.maxDetachedBytes) break;
      this.detached.delete(oldest);
      this.detachedBytes -= counted;
      this.sessions.delete(oldest.id);
      this.hooks.ended?.(oldest.id);
    }
  }

  /** Takes a session out of the detached total (attached again, closed, expired or replaced). */
  private uncount(session: Session): void {
    const counted = this.detached.get(session);
    if (counted === undefined) return;
    this.detached.delete(session);
    this.detachedBytes -= counted;
  }

  private sweep(): void {
    const now = Date.now();
    for (const [id, session] of this.sessions) {
      if (session.detachedAt !== undefined && now - session.detachedAt > this.ttlMs) {
        this.sessions.delete(id);
        this.uncount(session);
        this.hooks.ended?.(id);
      }
    }
  }
}
