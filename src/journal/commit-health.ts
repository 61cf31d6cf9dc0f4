import type { Logger } from '../observability/logger.js';

/** How often a journal that cannot commit tries one small commit, to learn that its disk writes again. */
export const COMMIT_PROBE_MS = 5_000;

/**
 * Whether the journal can commit now: set by a failed commit (EIO from a failing disk, ENOSPC, ...), cleared by the
 * next commit that succeeds. While set, nothing a client sends can be made durable, so the server says so where load
 * balancers look (the journal's owner maps it to gRPC health). Recovery is learned without a client: a server that
 * says NOT_SERVING is sent no work, so no accept would ever try the disk again. While failing, one small commit
 * (`probe`) is tried every {@link COMMIT_PROBE_MS}, never two at once (the next is scheduled when one settled), so a
 * disk that hangs costs one pending write, not a pile of them; any other commit that succeeds meanwhile (a finished
 * trajectory, an ack) clears it as well.
 */
export class CommitHealth {
  private failure: string | undefined;
  private timer: NodeJS.Timeout | undefined;
  private probing = false;
  private closed = false;

  constructor(
    private readonly options: {
      log: Logger;
      /** One small commit; resolves once committed and fsynced, rejects when it failed. */
      probe: () => Promise<void>;
      /** Told on every change of {@link reason}. */
      onChange: () => void;
      probeEveryMs?: number;
    },
  ) {}

  /** Why the journal cannot commit now (the last commit failed), one line; undefined while commits succeed. */
  get reason(): string | undefined {
    return this.failure;
  }

  /**
   * A commit failed with `err` (the cause lmdb-js reported). Logged at error once per outage, one line (`reason`); the
   * error itself, stack and all, at debug.
   */
  failed(reason: string, err: unknown): void {
    this.options.log.debug({ err }, 'journal write failed');
    if (this.closed) return;
    const first = this.failure === undefined;
    this.failure = reason;
    if (first) {
      this.options.log.error({ reason }, 'journal cannot commit: RolloutService NOT_SERVING until a commit succeeds again');
      this.options.onChange();
    }
    this.schedule();
  }

  /** A commit succeeded. */
  succeeded(): void {
    if (this.failure === undefined) return;
    this.failure = undefined;
    clearTimeout(this.timer);
    this.timer = undefined;
    if (this.closed) return;
    this.options.log.info('journal commits again: RolloutService SERVING');
    this.options.onChange();
  }

  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private schedule(): void {
    if (this.timer !== undefined || this.probing || this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (this.failure === undefined || this.closed) return;
      this.probing = true;
      // The probe's own outcome reaches failed/succeeded through the journal's write path; here it only re-arms.
      void this.options
        .probe()
        .catch(() => undefined)
        .finally(() => {
          this.probing = false;
          if (this.failure !== undefined) this.schedule();
        });
    }, this.options.probeEveryMs ?? COMMIT_PROBE_MS);
    this.timer.unref();
  }
}
