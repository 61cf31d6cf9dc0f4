import type { Logger } from '../observability/logger.js';
import { backendKind } from './kinds.js';
import type { EngineClient } from './types.js';

/** The budget of one health probe of `client`: the pool's, plus what its kind's check takes by design. */
export function healthBudgetMs(client: EngineClient, timeoutMs: number): number {
  return timeoutMs + backendKind(client.kind).capabilities.healthAnswerDelayMs;
}

export interface HealthProberOptions {
  /** Time between the end of one probe round and the start of the next. */
  intervalMs: number;
  /** Budget of one probe; a probe that does not answer in time counts as a failure. */
  timeoutMs: number;
  /** Consecutive failed probes before a backend is reported unhealthy (one success reports it healthy). */
  failureThreshold: number;
  logger: Logger;
  /**
   * Called after each successful probe of a backend (the pool uses it to retry learning a backend's limits); `target`
   * is the one probed (an id may name another backend by the time its probe answers).
   */
  onHealthy?: (id: string, target: ProbeTarget) => void;
  /** Called after each failed probe of a backend (`target`: the one probed), whether or not it changes anything. */
  onFailed?: (id: string, target: ProbeTarget) => void;
}

/** A backend as the prober sees it. */
export interface ProbeTarget {
  readonly id: string;
  readonly client: EngineClient;
  readonly healthy: boolean;
  /** The pool paused its engine (see EngineClient.health). */
  readonly enginePaused: boolean;
}

/**
 * Periodically asks every engine its health endpoint and reports transitions. Rounds never overlap (the next
 * round is scheduled when the previous one ends), and the timer is unref'd so it never keeps a process alive.
 * A single slow probe does not flip a backend: it takes `failureThreshold` failures in a row, because marking a
 * backend unhealthy moves its trajectories and throws away their prefix caches.
 */
export class HealthProber {
  /**
   * Consecutive failed probes per target, by identity: a backend removed and added again under its id (its url, by
   * default) starts from none, and a late failure of the removed one is not counted against the new one.
   */
  readonly #failures = new Map<ProbeTarget, number>();
  #timer: NodeJS.Timeout | undefined;
  #running = false;
  #round: Promise<void> | undefined;

  constructor(
    private readonly targets: () => readonly ProbeTarget[],
    /** `target`: the one probed (an id may name another backend by the time its probe answers). */
    private readonly report: (id: string, healthy: boolean, target: ProbeTarget) => void,
    private readonly options: HealthProberOptions,
  ) {}

  get running(): boolean {
    return this.#running;
  }

  start(): void {
    if (this.#running) return;
    this.#running = true;
    this.#schedule(0);
  }

  stop(): void {
    this.#running = false;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  /** Probes every backend once, now (also what the timer runs). Concurrent calls share one round. */
  probeOnce(): Promise<void> {
    this.#round ??= this.#probeAll().finally(() => {
      this.#round = undefined;
    });
    return this.#round;
  }

  #schedule(delayMs: number): void {
    this.#timer = setTimeout(() => {
      this.probeOnce()
        .catch((err: unknown) => this.options.logger.error({ err }, 'health probe round failed'))
        .finally(() => {
          if (this.#running) this.#schedule(this.options.intervalMs);
        });
    }, delayMs);
    this.#timer.unref();
  }

  async #probeAll(): Promise<void> {
    const targets = this.targets();
    const live = new Set(targets);
    for (const target of this.#failures.keys()) if (!live.has(target)) this.#failures.delete(target);
    await Promise.all(
      targets.map((t) =>
        this.#probe(t).catch((err: unknown) => this.options.logger.error({ backend: t.id, err }, 'health probe report failed')),
      ),
    );
  }

  async #probe(target: ProbeTarget): Promise<void> {
    let ok: boolean;
    try {
      ok = await target.client.health(AbortSignal.timeout(healthBudgetMs(target.client, this.options.timeoutMs)), { paused: target.enginePaused });
    } catch (err) {
      this.options.logger.debug({ backend: target.id, err }, 'health probe threw');
      ok = false;
    }
    if (ok) {
      this.#failures.delete(target);
      if (!target.healthy) this.report(target.id, true, target);
      this.options.onHealthy?.(target.id, target);
      return;
    }
    const failures = (this.#failures.get(target) ?? 0) + 1;
    this.#failures.set(target, failures);
    this.options.onFailed?.(target.id, target);
    if (target.healthy && failures >= this.options.failureThreshold) this.report(target.id, false, target);
  }
}
