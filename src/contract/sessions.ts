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
 * keep running and stay readable through GetTrajectory).
 */
export class SessionManager {
  private readonly sessions = new Map<string, Session>();
  private readonly sweeper: NodeJS.Timeout;

  constructor(
    private readonly ttlMs: number,
    private readonly hooks: SessionHooks = {},
  ) {
    this.sweeper = setInterval(() => this.sweep(), Math.min(ttlMs, 60_000));
    this.sweeper.unref();
  }

  /**
   * Opens (or, with resume, re-opens) a session. Resuming an unknown id is NOT_FOUND, so a client learns that
   * its unacked trajectories are gone instead of waiting for them.
   */
  open(sessionId: string, resume: boolean, stageEvents: boolean): Session {
    const id = sessionId || randomUUID();
    const existing = this.sessions.get(id);
    if (resume) {
      if (!existing) throw new RolloutError('not_found', `session "${id}" is unknown or expired; open it without resume`);
      if (existing.detachedAt === undefined) throw new RolloutError('failed_precondition', `session "${id}" is attached to another stream`);
      existing.stageEvents = stageEvents;
      return existing;
    }
    if (existing && existing.detachedAt === undefined) throw new RolloutError('already_exists', `session "${id}" is open on another stream`);
    const session = new Session(id, stageEvents);
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
    const session = new Session(sessionId, false);
    session.detachedAt = Date.now();
    this.sessions.set(sessionId, session);
    return session;
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
