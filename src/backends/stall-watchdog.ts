import type { Logger } from '../observability/logger.js';
import type { BackendState } from './backend-state.js';
import type { EngineClient } from './types.js';

/** Default of BackendPoolOptions.stallMs (config backendStallMs). */
export const DEFAULT_STALL_MS = 60_000;

export interface StallWatchdogOptions {
  /**
   * How long an engine may leave every request it has unanswered while its work counters stand still before it counts
   * as hung (ms, > 0).
   */
  stallMs: number;
  /** Budget of one read of an engine's counters (EngineClient.progress); one that runs out says nothing. */
  timeoutMs: number;
  logger: Logger;
  /** The engine is hung: `quietMs` since it last answered (or since its requests began, when it had none to answer). */
  onStall: (backend: BackendState, quietMs: number) => void;
  /**
   * A hung engine's counters moved: it works again. `restarted`: they went back (an engine's counters only grow, so it
   * is another process, started since, whose weights nothing here knows).
   */
  onMoved: (backend: BackendState, restarted: boolean) => void;
  /**
   * True while no engine can be judged: answers are waiting for room in the response budget (ResponseBudget.waiting),
   * so an engine that looks quiet may have answered already, its body not read yet.
   */
  holdOff?: () => boolean;
}

/** An engine's counters as last read: `value` since `since` (performance.now() ms), with no answer since either. */
interface Watch {
  value: number;
  since: number;
}

/**
 * Finds engines that accept requests and never answer them while their health endpoint still says 200 — a vLLM whose
 * engine core or a GPU worker is stuck behind a live API server. Nothing on the wire tells such an engine from a long
 * generation: a non-streamed completion sends nothing, not even its headers, until it is done, so the requests' own
 * timeout (backendRequestTimeoutMs, 300 s) was all that bounded them, and every trajectory placed there waited it out.
 * What does tell them apart is the engine's own work counters (EngineClient.progress: tokens prefilled and generated,
 * from its Prometheus /metrics): a working engine moves them at every step, a hung one does not.
 *
 * So, every `stallMs / 4`: an engine with requests at it that none of them has answered for that long has its counters
 * read (an engine answering requests is never asked: answers are progress); when they stood still, with no answer,
 * for `stallMs`, `onStall` (the pool ends its requests as lost — they fail over — and takes it out of routing). A hung
 * engine's counters are read at every round after: `onMoved` when they move (it worked again, or restarted).
 *
 * Left alone: an engine without counters (no /metrics, SGLang without --enable-metrics, a gateway; logged once); one
 * the pool holds paused (a KEEP pause freezes its requests by design) or is pausing or resuming; every engine while
 * answers wait for room in the response budget (an answer may be in, unread); and rounds whose read
 * fails or runs out of time (an engine hung as a whole is the health prober's). Rounds never overlap; the timer is
 * unref'd.
 */
export class StallWatchdog {
  readonly #watches = new Map<BackendState, Watch>();
  /** Engines whose /metrics has no counters to read, by client (logged once each). */
  readonly #unsupported = new WeakSet<EngineClient>();
  #timer: NodeJS.Timeout | undefined;
  #running = false;
  #round: Promise<void> | undefined;

  constructor(
    private readonly targets: () => readonly BackendState[],
    private readonly options: StallWatchdogOptions,
  ) {}

  /** Time between the end of one round and the start of the next. */
  get intervalMs(): number {
    return Math.max(10, Math.floor(this.options.stallMs / 4));
  }

  start(): void {
    if (this.#running) return;
    this.#running = true;
    this.#schedule();
  }

  stop(): void {
    this.#running = false;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  /** One round now (what the timer runs). Concurrent calls share one round. */
  checkOnce(): Promise<void> {
    this.#round ??= this.#checkAll().finally(() => {
      this.#round = undefined;
    });
    return this.#round;
  }

  #schedule(): void {
    this.#timer = setTimeout(() => {
      this.checkOnce()
        .catch((err: unknown) => this.options.logger.error({ err }, 'stall watchdog round failed'))
        .finally(() => {
          if (this.#running) this.#schedule();
        });
    }, this.intervalMs);
    this.#timer.unref();
  }

  async #checkAll(): Promise<void> {
    const targets = this.targets();
    const live = new Set(targets);
    for (const target of this.#watches.keys()) if (!live.has(target)) this.#watches.delete(target);
    await Promise.all(targets.map((t) => this.#check(t).catch((err: unknown) => this.options.logger.error({ backend: t.id, err }, 'stall check failed'))));
  }

  /** Whether `b` is to be watched now, and since when none of its requests has answered (undefined: not watched). */
  #quietSince(b: BackendState): number | undefined {
    if (b.requests.size === 0 || !b.usable || b.paused || b.enginePaused || b.engineCall !== undefined || this.options.holdOff?.() === true) return undefined;
    return Math.max(b.lastAnswerAt, b.busySince);
  }

  async #check(b: BackendState): Promise<void> {
    const { client } = b;
    if (client.progress === undefined || this.#unsupported.has(client) || b.removed) return void this.#watches.delete(b);
    const now = performance.now();
    if (!b.stalled) {
      const quietSince = this.#quietSince(b);
      if (quietSince === undefined || now - quietSince < this.intervalMs) return void this.#watches.delete(b);
    }
    let value: number | undefined;
    try {
      value = await client.progress(AbortSignal.timeout(this.options.timeoutMs));
    } catch (err) {
      this.options.logger.debug({ backend: b.id, err }, 'engine counters not read (this round says nothing)');
      return;
    }
    if (value === undefined) {
      this.#unsupported.add(client);
      this.#watches.delete(b);
      this.options.logger.info({ backend: b.id, url: client.url }, 'engine serves no work counters at GET /metrics: no stall watchdog for it (a hang behind a live /health is bounded by backendRequestTimeoutMs only)');
      return;
    }
    const at = performance.now();
    const watch = this.#watches.get(b);
    if (b.stalled) {
      if (watch === undefined) this.#watches.set(b, { value, since: at });
      else if (watch.value !== value) {
        this.#watches.delete(b);
        this.options.onMoved(b, value < watch.value);
      }
      return;
    }
    const quietSince = this.#quietSince(b); // again: an answer, a pause or the last request's end may have come meanwhile
    if (quietSince === undefined) return void this.#watches.delete(b);
    if (watch === undefined || watch.value !== value || watch.since < quietSince) {
      this.#watches.set(b, { value, since: at });
      return;
    }
    // Unchanged from `watch.since` to at least `now` (this read began after it), with no answer in between.
    if (now - watch.since >= this.options.stallMs) this.options.onStall(b, Math.round(at - quietSince));
  }
}
