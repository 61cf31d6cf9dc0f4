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
 * `maxUnackedBytes` (see Session).
 */
export class SessionManager {
  private readonly sessions = new Map<string, Session>();
  private readonly sweeper: NodeJS.Timeout;

  constructor(
    private readonly ttlMs: number,
    private readonly maxUnackedBytes: number = Number.POSITIVE_INFINITY,
    private readonly hooks: SessionHooks = {},
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
      return existing;
    }
    if (existing && existing.detachedAt === undefined) throw new RolloutError('already_exists', `session "${id}" is open on another stream`);
    const session = new Session(id, stageEvents, this.maxUnackedBytes);
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
