import { RolloutError, throwIfAborted } from '../errors.js';
import { silentLogger, type Logger } from '../observability/logger.js';
import { BackendGone, BackendState, InflightRequest } from './backend-state.js';
import { ContextOverflowError } from './context-overflow.js';
import { EngineUnreachableError } from './engine-http.js';
import { EngineMisdeliveredError } from './generate-answer.js';
import { backendInfo as info, type BackendInfo, type PoolStats } from './backend-info.js';
import { LimitLearner, needsLearning } from './engine-limits.js';
import { checkShortLength, type ShortLengthHost } from './short-length.js';
import { healthBudgetMs, HealthProber } from './health-prober.js';
import { DEFAULT_STALL_MS, StallWatchdog } from './stall-watchdog.js';
import { PoolLease, type BackendLease, type LeaseHost, type SampledVersions } from './lease.js';
import { logprobsMismatch } from './logprobs-mode.js';
import { enginePausesAtAll, pauseBackends, resumeBackends, resumeEngine, resumeHeld } from './pause-control.js';
import { LoadHeap, type PickResult } from './picker.js';
import { DEFAULT_MAX_BUFFERED_RESPONSE_BYTES, ResponseBudget } from './response-budget.js';
import { DEFAULT_MAX_RETRY_AFTER_MS, type AddBackendOptions, type BackendPoolOptions, type PoolWeights } from './pool-options.js';
import type { EngineClient, GenerateRequest, GenerateResult, PauseMode } from './types.js';

export type { AddBackendOptions, BackendPoolOptions, PoolWeights } from './pool-options.js';
export type { BackendInfo, PoolStats } from './backend-info.js';

interface AcquireWaiter {
  resolve: (backend: BackendState) => void;
  reject: (err: unknown) => void;
  cleanup: () => void;
}

const eligible = (b: BackendState): boolean => b.eligible;

/**
 * The set of engines and the routing between them. A trajectory is placed once, on the eligible backend with the
 * least load for its capacity (heap order: see `compareLoad` — (trajectories + queued requests + 1) / max
 * concurrency, then requests per capacity, then id), and stays there for its whole life so
 * its prefix stays cached; it moves only when its backend is removed or goes unhealthy. Requests beyond a
 * backend's max concurrency wait in its slot queue, deepest trajectory first (`queueOrder`). When no backend is
 * eligible, `acquire` waits (abortable, bounded by `acquireTimeoutMs`) instead of failing at once, so a
 * restarting engine or a weight update does not fail every task in flight.
 *
 * Invariants: a backend's `inflightTrajectories` equals the leases pinned to it; counters return to zero when
 * every lease is released; a draining backend receives no new trajectory.
 */
export class BackendPool {
  readonly #log: Logger;
  readonly #backends = new Map<string, BackendState>();
  readonly #heap = new LoadHeap<BackendState>();
  readonly #leases = new Set<PoolLease>();
  readonly #waiters: AcquireWaiter[] = [];
  readonly #acquireTimeoutMs: number;
  readonly #queueOrder: 'turns' | 'fifo';
  readonly #defaultMaxConcurrency: number;
  readonly #limits: LimitLearner;
  readonly #shortLength: ShortLengthHost;
  readonly #prober: HealthProber;
  /** Undefined when disabled (stallMs 0). */
  readonly #watchdog: StallWatchdog | undefined;
  readonly #host: LeaseHost;
  readonly #healthTimeoutMs: number;
  readonly #pauseAbortGraceMs: number;
  readonly #holdRecovered: boolean;
  #nextId = 0;
  #failovers = 0;
  /** A pool-wide pause is in effect: backends added meanwhile join paused. */
  #pausedAll = false;
  /** The policy version last set for the whole pool: what a backend added without one serves. */
  #poolVersion = 0;
  /**
   * Where the pool-wide weight-sync state is made durable (the journal, see WeightsRecord): called after every
   * pool-wide pause and resume, awaited before the call answers. Unset: nothing is kept across a restart.
   */
  recordWeights: ((state: PoolWeights) => Promise<void>) | undefined;
  /**
   * The bytes of engine answers buffered at once, shared by the pool's engine clients (pass it as the client's
   * `responseBudget`, see createEngineClient): the per-request cap bounds one answer, this bounds them all together.
   */
  readonly responseBudget: ResponseBudget;

  constructor(options: BackendPoolOptions = {}) {
    this.#log = (options.logger ?? silentLogger()).child({ component: 'backend-pool' });
    this.responseBudget = new ResponseBudget(options.maxBufferedResponseBytes ?? DEFAULT_MAX_BUFFERED_RESPONSE_BYTES);
    this.#acquireTimeoutMs = options.acquireTimeoutMs ?? 30_000;
    this.#queueOrder = options.queueOrder ?? 'turns';
    this.#defaultMaxConcurrency = options.defaultMaxConcurrency ?? 256;
    this.#limits = new LimitLearner({
      log: this.#log,
      modelInfoTimeoutMs: options.modelInfoTimeoutMs ?? 5_000,
      defaultMaxConcurrency: this.#defaultMaxConcurrency,
      rekey: (backend, change) => this.#heap.update(backend, eligible, change),
      wake: () => this.#wake(),
    });
    this.#shortLength = { log: this.#log, relearn: (backend) => this.learn(backend.id).then(() => undefined, () => undefined) };
    this.#healthTimeoutMs = options.healthTimeoutMs ?? 2_000;
    this.#pauseAbortGraceMs = options.pauseAbortGraceMs ?? 10_000;
    this.#holdRecovered = options.holdRecoveredBackends ?? true;
    this.#prober = new HealthProber(
      () => [...this.#backends.values()],
      // A probe can finish after its backend was removed (its id perhaps given to another engine since): such a report
      // is moot, never an error, and never about the backend now under that id.
      (id, healthy, target) => {
        const backend = this.#backends.get(id);
        if (backend !== target) return;
        // A hung engine (StallWatchdog) answered its health checks all along: a passing probe says nothing about it.
        if (healthy && backend.stalled) return;
        this.setHealthy(id, healthy);
      },
      {
        intervalMs: options.healthIntervalMs ?? 5_000,
        timeoutMs: this.#healthTimeoutMs,
        failureThreshold: options.healthFailureThreshold ?? 2,
        // An engine whose limits could not be learned when it was added is asked again once it answers probes.
        onHealthy: (id, target) => {
          const backend = this.#backends.get(id);
          if (backend !== target) return; // removed since (its id perhaps given to another backend, probed on its own)
          if (needsLearning(backend)) void this.learn(id).catch(() => undefined);
          // A resume that could not reach it yet is retried at every probe it answers (not only when it recovers).
          if (backend.resumePending && backend.healthy && !backend.weightsUnknown) this.#resumeRecovered(backend);
        },
        // A hung engine that fails a probe went down (perhaps to restart): from now on it recovers as any engine that was
        // down, at its next passing probe.
        onFailed: (id, target) => {
          const backend = this.#backends.get(id);
          if (backend !== target || !backend.stalled) return;
          backend.stalled = false;
          this.#log.info({ backend: id }, 'hung engine fails its health checks now: it is back once they pass');
        },
        logger: this.#log,
      },
    );
    const stallMs = options.stallMs ?? DEFAULT_STALL_MS;
    this.#watchdog =
      stallMs > 0
        ? new StallWatchdog(() => [...this.#backends.values()], {
            stallMs,
            timeoutMs: this.#healthTimeoutMs,
            logger: this.#log,
            onStall: (backend, quietMs) => this.#stalled(backend, quietMs),
            holdOff: () => this.responseBudget.waiting > 0,
            onMoved: (backend, restarted) => {
              if (this.#backends.get(backend.id) !== backend || !backend.stalled) return;
              // Same process (counters went on from where they stood) and no weight sync labelled it with another version
              // meanwhile: it serves the weights it is labelled with, nothing to confirm. Otherwise as an engine back
              // after it was down (held while the pool's version is not 0, see #setHealthy).
              const weightsKept = !restarted && backend.policyVersion === backend.stalledAtVersion;
              this.#log.warn({ backend: backend.id, restarted, policyVersion: backend.policyVersion, stalledAtVersion: backend.stalledAtVersion }, 'hung engine works again (its counters moved)');
              this.#setHealthy(backend, true, weightsKept);
            },
          })
        : undefined;
    this.#host = {
      maxFailoversPerRequest: options.maxFailoversPerRequest ?? 3,
      maxBusyRetries: options.maxBusyRetries ?? 8,
      busyBackoffMs: options.busyBackoffMs ?? 250,
      maxRetryAfterMs: options.maxRetryAfterMs ?? DEFAULT_MAX_RETRY_AFTER_MS,
      assign: (signal) => this.#assign(signal),
      assignOther: (from) => this.#assignOther(from),
      send: (backend, request, turn) => this.#send(backend, request, this.#queueOrder === 'turns' ? turn : 0),
      leave: (backend, lease) => this.#leave(backend, lease),
      failedOver: (lease, from, to, why) => {
        this.#failovers++;
        from.failoversOut++;
        this.#log.warn({ trajectory: lease.trajectoryKey, from: from.id, to: to.id, why }, 'trajectory failed over');
      },
    };
  }

  /**
   * Registers an engine; it takes trajectories at once if healthy. Throws already_exists on a duplicate id.
   * Unless `maxModelLen` is given, the engine's context length is asked in the background (await
   * {@link learn} to have it before going on); until known, trajectories on it are bounded by their token budgets
   * only, and an engine's context-length refusal still ends them as truncation. So are its logprobs mode and, when
   * `maxConcurrency` is not given, its capacity (the pool's default meanwhile). While a pool-wide pause is in
   * effect (see {@link pause}) the backend joins paused: its requests wait until the pool-wide resume, which also
   * gives it the resumed policy version.
   */
  add(client: EngineClient, options: AddBackendOptions): BackendInfo {
    const id = options.id ?? `backend-${this.#nextId++}`;
    if (this.#backends.has(id)) throw new RolloutError('already_exists', `backend ${id} already exists`);
    const configured = options.maxConcurrency !== undefined && options.maxConcurrency !== 0;
    if (configured && (!Number.isInteger(options.maxConcurrency) || options.maxConcurrency! < 1)) {
      throw RolloutError.invalid('max_concurrency', 'must be a positive integer (or 0: what the engine reports)');
    }
    const backend = new BackendState(id, client, configured ? options.maxConcurrency! : this.#defaultMaxConcurrency, options.model, options.policyVersion ?? this.#poolVersion);
    backend.capacitySource = configured ? 'configured' : 'default';
    backend.declaredLogprobsMode = options.logprobsMode;
    backend.healthy = options.healthy ?? true;
    backend.maxModelLen = options.maxModelLen;
    backend.maxModelLenConfigured = options.maxModelLen !== undefined;
    if (this.#pausedAll) backend.gate.close();
    this.#backends.set(id, backend);
    this.#heap.update(backend, eligible);
    this.#log.info({ backend: id, url: client.url, kind: client.kind, maxConcurrency: backend.maxConcurrency, capacitySource: backend.capacitySource }, 'backend added');
    this.#wake();
    if (needsLearning(backend)) void this.learn(id).catch(() => undefined);
    return info(backend);
  }

  /**
   * Learns what the engine can say about itself, within `modelInfoTimeoutMs` (see LimitLearner): its context length
   * (GET /v1/models → max_model_len, and SGLang's token pool; whether it serves the backend's model at all) and how it runs
   * (EngineClient.serverInfo: logprobs mode, capacity). Never throws for an engine that cannot answer: what is unknown
   * stays unknown (logged) and is asked again after the backend's next successful health probe. Concurrent calls
   * share one attempt; what is known is not asked again (a context-length refusal from the engine updates the limit,
   * see #sendOnce; an engine that answered without saying is not asked again) — unless it may have changed: after the
   * backend came back from being down (see {@link setHealthy}), or after an answer cut short of a limit the engine
   * should not have reached (see checkShortLength in short-length.ts). What was configured is never asked.
   */
  async learn(id: string, client?: EngineClient): Promise<BackendInfo> {
    const backend = this.#get(id, client);
    if (!needsLearning(backend)) return info(backend);
    await this.#limits.learn(backend);
    return info(backend);
  }

  /**
   * Refuses a backend whose engine contradicts what was declared about it: invalid_argument (field logprobs_mode)
   * when it reports another logprobs mode than declared, failed_precondition when it reports logits instead of
   * logprobs. Callers adding a backend call it after {@link learn} and remove the backend when it throws.
   */
  checkEngineAgrees(id: string, client?: EngineClient): void {
    this.#limits.checkAgrees(this.#get(id, client));
  }

  /** The smallest context length among backends that state one (undefined when none does), for admission. */
  minMaxModelLen(): number | undefined {
    let min: number | undefined;
    for (const b of this.#backends.values()) if (b.maxModelLen !== undefined && (min === undefined || b.maxModelLen < min)) min = b.maxModelLen;
    return min;
  }

  /**
   * Takes a backend out. With `drain`, it stops receiving trajectories and the promise resolves when its last
   * trajectory has ended; without, it goes at once: its running requests are aborted and their trajectories
   * fail over to other backends on the spot. A drain whose `signal` fires first (the RPC's deadline or
   * cancellation) stops waiting and rejects, and the backend takes trajectories again unless another drain of it
   * is still waiting: a call that did not complete changes nothing. (A drain of a paused backend waits for the
   * resume: its trajectories are held at its gate.) With `client`, only the backend added with that engine client
   * (not_found otherwise, see #get).
   */
  async remove(id: string, options: { drain: boolean; signal?: AbortSignal; client?: EngineClient }): Promise<void> {
    const backend = this.#get(id, options.client);
    if (options.drain && backend.inflightTrajectories > 0) {
      this.#heap.update(backend, eligible, (b) => (b.draining = true));
      this.#log.info({ backend: id, trajectories: backend.inflightTrajectories }, 'backend draining');
      const { signal } = options;
      await new Promise<void>((resolve, reject) => {
        const drained = (): void => {
          signal?.removeEventListener('abort', onAbort);
          resolve();
        };
        const onAbort = (): void => {
          const at = backend.drainWaiters.indexOf(drained);
          if (at < 0) return;
          backend.drainWaiters.splice(at, 1);
          if (backend.drainWaiters.length === 0 && !backend.removed) {
            this.#heap.update(backend, eligible, (b) => (b.draining = false));
            this.#log.info({ backend: id }, 'drain given up (its call ended first): the backend takes trajectories again');
            this.#wake();
          }
          reject(RolloutError.from(signal!.reason, 'cancelled'));
        };
        backend.drainWaiters.push(drained);
        if (signal?.aborted) onAbort();
        else signal?.addEventListener('abort', onAbort, { once: true });
      });
    }
    if (backend.removed) return;
    backend.removed = true;
    this.#backends.delete(id);
    this.#heap.delete(backend);
    const gone = new BackendGone(id, 'removed');
    backend.gate.rejectAll(gone);
    backend.slots.rejectAll(gone);
    for (const request of backend.requests) request.controller.abort(gone);
    for (const resolve of backend.drainWaiters.splice(0)) resolve();
    this.#log.info({ backend: id, drained: options.drain, movedTrajectories: backend.inflightTrajectories }, 'backend removed');
    // An engine this pool paused (or is pausing) is not left paused for whoever uses it next (this pool, if it is
    // added back): resumed after — or instead of — a pause call still out.
    if ((backend.enginePaused || backend.engineCall?.kind === 'pause') && backend.client.resume) {
      backend.resumes++; // a resume: a pause still under way is superseded by it
      await resumeEngine(backend, AbortSignal.timeout(this.#healthTimeoutMs), this.#log).catch((err: unknown) =>
        this.#log.warn({ backend: id, err }, 'could not resume the removed backend\'s engine: it stays paused'),
      );
    }
    backend.client.close?.();
  }

  /** Marks a backend (un)healthy: unhealthy ones take no trajectories and their trajectories move on next use. */
  setHealthy(id: string, healthy: boolean): void {
    this.#setHealthy(this.#get(id), healthy, false);
  }

  /** {@link setHealthy}; `weightsKept`: a recovery known to keep the engine's weights (a hung engine that went on) is never held. */
  #setHealthy(backend: BackendState, healthy: boolean, weightsKept: boolean): void {
    const { id } = backend;
    if (healthy) backend.stalled = false;
    if (backend.healthy === healthy) return;
    // Perhaps restarted with other weights, or it missed a weight sync (see BackendPoolOptions.holdRecoveredBackends):
    // held until a resume reaches it — unless a pause is in effect on it, whose resume confirms them anyway (it waits at
    // its gate meanwhile like every paused engine). One held already (it went down again before the resume) stays held.
    const hold = healthy && (backend.weightsUnknown || (!weightsKept && this.#holdRecovered && backend.policyVersion !== 0 && !backend.paused));
    this.#heap.update(backend, eligible, (b) => {
      b.healthy = healthy;
      if (hold) b.weightsUnknown = true;
    });
    this.#log.warn({ backend: id, healthy }, healthy ? 'backend healthy again' : 'backend unhealthy');
    if (healthy) {
      // Perhaps restarted, with another --max-model-len, capacity, logprobs mode or model: what the engine said about
      // itself is asked again (learn, after this probe) — what was configured is kept. Until it answers, what it said
      // before stays in use.
      if (!backend.maxModelLenConfigured) backend.modelInfoStale = true;
      if (backend.serverInfo !== undefined) backend.serverInfoStale = true;
      if (hold) {
        backend.gate.close();
        this.#log.warn(
          { backend: id, policyVersion: backend.policyVersion },
          'backend back after it was down: it takes no trajectory until the next ResumeGeneration confirms its weights (it may have restarted with others or missed a weight sync); trajectories wait for another engine for backendAcquireTimeoutMs, then end BACKEND_ERROR',
        );
      } else if (backend.resumePending) {
        this.#resumeRecovered(backend);
      }
      this.#wake();
    }
    else {
      // Queued and running requests both move: an engine that stopped answering must not hold its trajectories
      // until their run timeout.
      const gone = new BackendGone(id, backend.stalled ? 'stalled' : 'unhealthy');
      backend.gate.rejectAll(gone);
      backend.slots.rejectAll(gone);
      for (const request of backend.requests) request.controller.abort(gone);
    }
  }

  /**
   * The watchdog found the engine hung (see StallWatchdog): its requests end as lost — their trajectories fail over, as
   * from an engine gone (bounded by maxFailoversPerRequest) — and it is marked unhealthy until its counters move or it
   * recovers from being down; a passing probe alone does not lift it.
   */
  #stalled(backend: BackendState, quietMs: number): void {
    if (this.#backends.get(backend.id) !== backend || backend.stalled || !backend.healthy) return;
    backend.stalled = true;
    backend.stalls++;
    backend.stalledAtVersion = backend.policyVersion;
    this.#log.warn(
      { backend: backend.id, url: backend.client.url, quietMs, requests: backend.requests.size, trajectories: backend.inflightTrajectories },
      'engine hung: none of its requests answered and its work counters (GET /metrics) did not move for backendStallMs, though it may still answer /health; its requests move to other engines and it takes none until its counters move',
    );
    this.#setHealthy(backend, false, false);
  }

  /**
   * The engine of a backend that was down when a pool-wide resume came, and that this pool had paused: resumed now
   * that it answers again, and its gate opened unless a pause started since.
   */
  #resumeRecovered(backend: BackendState): void {
    if (backend.engineCall !== undefined) return; // a call is out (this retry's, or a pause's or resume's that decides)
    void resumeHeld(backend, AbortSignal.timeout(this.#healthTimeoutMs), this.#log).then(
      (opened) => opened && this.#log.info({ backend: backend.id }, 'backend resumed after it recovered'),
      (err: unknown) => this.#log.warn({ backend: backend.id, err }, 'could not resume the recovered backend\'s engine yet: retried at its next health probe'),
    );
  }

  /**
   * Records the policy (weights) version a backend serves, for every backend when `id` is omitted (and then for
   * backends added later). Prefer {@link resume}, which sets it while the engine is paused, so that no request
   * straddles the change unnoticed.
   */
  setPolicyVersion(version: number, id?: string): void {
    if (id === undefined) this.#poolVersion = version;
    for (const backend of id === undefined ? this.#backends.values() : [this.#get(id)]) backend.policyVersion = version;
  }

  /**
   * Pauses generation on one backend, or on all of them when `id` is omitted (a weight update); see
   * {@link pauseBackends} for what each mode does. Held requests wait in the pool — they do not fail, fail over,
   * or count against acquire timeouts —, and new trajectories go to backends that are not paused while there are
   * any. A pool-wide pause also holds backends added before the pool-wide resume. With a journal, the pool-wide
   * state is recorded before the call answers; a record that fails is `unavailable` (see #recordPoolWeights).
   */
  async pause(mode: PauseMode, options: { id?: string; signal?: AbortSignal } = {}): Promise<BackendInfo[]> {
    const targets = options.id === undefined ? [...this.#backends.values()] : [this.#get(options.id)];
    let began = false;
    let paused: readonly BackendState[];
    try {
      paused = await pauseBackends(targets, mode, {
        signal: options.signal ?? new AbortController().signal,
        abortGraceMs: this.#pauseAbortGraceMs,
        log: this.#log,
        skipUnhealthy: options.id === undefined,
        // Only once the mode is known to be possible everywhere, before any gate closes.
        beforePause: () => {
          began = true;
          if (options.id === undefined) this.#pausedAll = true;
        },
      });
    } catch (err) {
      // The pause's own error is the answer; the state it left is recorded as well as can be.
      if (began && options.id === undefined) await this.#recordPoolWeights().catch(() => undefined);
      throw err;
    }
    if (began && options.id === undefined) await this.#recordPoolWeights();
    return paused.map(info);
  }

  /**
   * Resumes generation on one backend, or all when `id` is omitted (which also ends a pool-wide pause and makes
   * `policyVersion` the version of backends added later); see {@link resumeBackends}.
   */
  async resume(options: { id?: string; policyVersion?: number; signal?: AbortSignal } = {}): Promise<BackendInfo[]> {
    const { policyVersion } = options;
    if (policyVersion !== undefined && (!Number.isSafeInteger(policyVersion) || policyVersion < 0)) throw RolloutError.invalid('policy_version', `must be a non-negative integer, got ${policyVersion}`);
    const targets = options.id === undefined ? [...this.#backends.values()] : [this.#get(options.id)];
    if (options.id === undefined) {
      this.#pausedAll = false;
      if (policyVersion !== undefined) this.#poolVersion = policyVersion;
    }
    // The trainer's resume is what confirms the weights of an engine held since it came back (whether or not its engine
    // call then succeeds: that is about its pause, named in the error): it is usable again, and resumed as any other.
    for (const backend of targets) if (backend.weightsUnknown) this.#heap.update(backend, eligible, (b) => (b.weightsUnknown = false));
    this.#wake();
    let resumed: readonly BackendState[];
    try {
      resumed = await resumeBackends(targets, {
        signal: options.signal ?? new AbortController().signal,
        log: this.#log,
        skipUnhealthy: options.id === undefined,
        ...(policyVersion !== undefined && { policyVersion }),
      });
    } catch (err) {
      if (options.id === undefined) await this.#recordPoolWeights().catch(() => undefined);
      throw err;
    }
    if (options.id === undefined) await this.#recordPoolWeights();
    return resumed.map(info);
  }

  /**
   * The pool-wide state a restarted server found in its journal: the version backends serve (and backends added
   * later), and whether a pool-wide pause was in effect — then every gate is closed until the trainer's resume (the
   * engines are not called: the server before left them as they are).
   */
  restoreWeights(state: PoolWeights): void {
    this.#poolVersion = state.policyVersion;
    for (const backend of this.#backends.values()) backend.policyVersion = state.policyVersion;
    if (!state.paused) return;
    this.#pausedAll = true;
    // The server before may have paused their engines: the resume must resume them (and, for one down then, later).
    for (const backend of this.#backends.values()) {
      backend.gate.close();
      if (enginePausesAtAll(backend.client)) backend.enginePaused = true;
    }
    this.#log.warn({ policyVersion: state.policyVersion }, 'a pool-wide pause was in effect when the server stopped: generation stays paused until ResumeGeneration');
  }

  /** The pool-wide weight-sync state, as {@link recordWeights} keeps it. */
  /** The pool's settings a config sets (what the server was started with; for its log and tests). */
  get settings(): { holdRecoveredBackends: boolean; maxBusyRetries: number; busyBackoffMs: number; maxRetryAfterMs: number; maxFailoversPerRequest: number } {
    const { maxBusyRetries, busyBackoffMs, maxRetryAfterMs, maxFailoversPerRequest } = this.#host;
    return { holdRecoveredBackends: this.#holdRecovered, maxBusyRetries, busyBackoffMs, maxRetryAfterMs, maxFailoversPerRequest };
  }

  get weights(): PoolWeights {
    return { paused: this.#pausedAll, policyVersion: this.#poolVersion };
  }

  /**
   * Records the pool-wide state (journal). A failed record is `unavailable` for the caller — the pause or resume is in
   * effect, but a restart would not know it (it would come back unpaused, or tag tokens with the version before):
   * the trainer hears it, rather than an OK that is not durable, and retries once the journal can write (both calls
   * are idempotent).
   */
  async #recordPoolWeights(): Promise<void> {
    try {
      await this.recordWeights?.(this.weights);
    } catch (err) {
      this.#log.error({ err, ...this.weights }, 'could not record the weight-sync state in the journal: a restart will not know it');
      const state = this.weights.paused ? 'generation is paused' : `generation is resumed at policy version ${this.weights.policyVersion}`;
      throw new RolloutError('unavailable', `${state}, but the journal could not record it (a restart would not know it): ${RolloutError.from(err).message}; retry the call`, { cause: err });
    }
  }

  /**
   * Pins a new trajectory to the least-loaded eligible backend (one not paused nor held by a Retry-After, while there is
   * one). Waits for one if none is eligible; fails with backend_error after `acquireTimeoutMs`, or with the signal's
   * reason if aborted first.
   */
  async acquire(trajectoryKey: string, options: { signal?: AbortSignal } = {}): Promise<BackendLease> {
    const backend = await this.#assign(options.signal);
    const lease = new PoolLease(this.#host, trajectoryKey, backend);
    this.#leases.add(lease);
    return lease;
  }

  /**
   * What acquire would choose now, without assigning anything: the heap's least-loaded pick, passed over for a ready
   * one when it is paused or held by a Retry-After (see #preferReady) — as acquire does, so what it says is where a new
   * trajectory would really go.
   */
  pick(): PickResult<BackendInfo> {
    const result = this.#heap.pick(this.#backends.size);
    return result.type === 'pick' ? { type: 'pick', backend: info(this.#preferReady(result.backend)) } : result;
  }

  list(): BackendInfo[] {
    return [...this.#backends.values()].map(info);
  }

  stats(): PoolStats {
    const s: PoolStats = { backends: this.#backends.size, healthy: 0, eligible: this.#heap.size, inflightTrajectories: 0, inflightRequests: 0,
      queuedRequests: 0, assignedTotal: 0, failovers: this.#failovers, leases: this.#leases.size, waitingAcquires: this.#waiters.length };
    for (const b of this.#backends.values()) {
      if (b.healthy && b.refusal === undefined) s.healthy++;
      s.inflightTrajectories += b.inflightTrajectories;
      s.inflightRequests += b.inflightRequests;
      s.queuedRequests += b.slots.waiting;
      s.assignedTotal += b.assignedTotal;
    }
    return s;
  }

  /** Starts the background health prober and the stall watchdog (idempotent). */
  startHealthChecks(): void {
    this.#prober.start();
    this.#watchdog?.start();
  }

  stopHealthChecks(): void {
    this.#prober.stop();
    this.#watchdog?.stop();
  }

  /** Runs one probe round now (what the background prober does each interval). */
  probeHealth(): Promise<void> {
    return this.#prober.probeOnce();
  }

  /** Stops probing and fails waiting acquires; leases in flight keep working until released. */
  close(): void {
    this.#prober.stop();
    this.#watchdog?.stop();
    for (const waiter of this.#waiters.splice(0)) {
      waiter.cleanup();
      waiter.reject(new RolloutError('unavailable', 'backend pool closed'));
    }
    for (const backend of this.#backends.values()) backend.client.close?.();
  }

  /**
   * A request could not reach the engine (refused, reset, dropped): asks its health once, now, and marks it
   * unhealthy if it does not answer — which moves every trajectory on it — instead of waiting for the prober's
   * next rounds while each of its trajectories fails in turn. Requests that failed together share one check.
   */
  #suspect(backend: BackendState, cause: unknown): Promise<void> {
    backend.suspecting ??= (async () => {
      const budget = AbortSignal.timeout(healthBudgetMs(backend.client, this.#healthTimeoutMs));
      let ok: boolean;
      try {
        ok = await backend.client.health(budget, { paused: backend.enginePaused });
      } catch {
        ok = false;
      }
      // Only a definite answer moves every trajectory: an error status or a refused/reset connection. A probe that
      // merely ran out of time says nothing (a starved event loop here, or a busy engine, delays it as much as a
      // dead one) — the request still moves, and the prober's consecutive failures decide about the engine.
      const inconclusive = !ok && budget.aborted;
      this.#log.warn({ backend: backend.id, healthy: ok, inconclusive, err: cause }, 'engine unreachable; health checked at once');
      if (!ok && !inconclusive && this.#backends.get(backend.id) === backend) this.setHealthy(backend.id, false);
    })().finally(() => {
      backend.suspecting = undefined;
    });
    return backend.suspecting;
  }

  /**
   * The backend under `id`; with `client`, only the one added with that engine client: an id can be removed and given
   * to another backend meanwhile, and an AddBackend undoing its own add must not take that one out.
   */
  #get(id: string, client?: EngineClient): BackendState {
    const backend = this.#backends.get(id);
    if (backend === undefined) throw new RolloutError('not_found', `no backend ${id}`);
    if (client !== undefined && backend.client !== client) throw new RolloutError('not_found', `backend ${id} was removed (the id names another backend now)`);
    return backend;
  }

  /** Tells the log, once per backend, when its logprobs are not those of the distribution requests sample from. */
  #checkLogprobs(backend: BackendState, request: GenerateRequest): void {
    if (backend.logprobsWarned) return;
    const why = logprobsMismatch(backend.client.kind, backend.logprobsMode, request);
    if (why === undefined) return;
    backend.logprobsWarned = true;
    this.#log.warn({ backend: backend.id, logprobsMode: backend.logprobsMode }, `PPO-style ratios would be off: ${why}`);
  }

  #take(backend: BackendState): BackendState {
    this.#heap.update(backend, eligible, (b) => {
      b.inflightTrajectories++;
      b.assignedTotal++;
    });
    return backend;
  }

  #assign(signal: AbortSignal | undefined): Promise<BackendState> {
    throwIfAborted(signal);
    const now = this.#waiters.length === 0 ? this.#heap.pick(this.#backends.size) : undefined;
    if (now?.type === 'pick') return Promise.resolve(this.#take(this.#preferReady(now.backend)));
    return new Promise<BackendState>((resolve, reject) => {
      const fail = (err: unknown): void => {
        const i = this.#waiters.indexOf(waiter);
        if (i < 0) return;
        this.#waiters.splice(i, 1);
        waiter.cleanup();
        reject(err);
      };
      const onAbort = (): void => fail(RolloutError.from(signal?.reason, 'cancelled'));
      const timer = Number.isFinite(this.#acquireTimeoutMs)
        ? setTimeout(() => {
            const reason = now?.type === 'queue' ? now.reason : 'queued';
            const states = [...this.#backends.values()].map((b) => `${b.id} ${!b.usable ? b.unusableWhy : b.draining ? 'draining' : 'busy'}`);
            fail(new RolloutError('backend_error', `no eligible backend within ${this.#acquireTimeoutMs} ms (${[reason, ...states].join(', ')})`));
          }, this.#acquireTimeoutMs)
        : undefined;
      const waiter: AcquireWaiter = {
        resolve,
        reject,
        cleanup: () => {
          clearTimeout(timer);
          signal?.removeEventListener('abort', onAbort);
        },
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.#waiters.push(waiter);
    });
  }

  /**
   * The least-loaded eligible backend that is neither paused nor held by a Retry-After, when the heap's pick is one of
   * those and a free one exists: a rolling weight update pauses engines one at a time, and an engine that answered
   * busy said when it takes requests again (BackendState.retryNotBefore) — a new trajectory placed there would only
   * wait, while another engine could serve it now. Trajectories already on such an engine stay and wait for it, as on
   * a paused one: it is alive (failover is for engines gone), its hold is bounded (maxRetryAfterMs), it has their
   * prefixes cached, and moving them would pour its whole load onto the others — which may then be busy in turn.
   * When every eligible engine is paused or held, the heap's pick stands. Only costs a walk of the heap while one is.
   */
  #preferReady(picked: BackendState): BackendState {
    const now = performance.now();
    const ready = (b: BackendState): boolean => !b.paused && b.retryNotBefore <= now;
    if (ready(picked)) return picked;
    return this.#heap.ordered().find(ready) ?? picked;
  }

  /**
   * Another eligible backend that is neither paused nor held by a Retry-After, taken for a trajectory at once; undefined
   * when there is none now or acquires are waiting (they come first). Never waits: the caller stays where it is then.
   */
  #assignOther(from: BackendState): BackendState | undefined {
    if (this.#waiters.length > 0) return undefined;
    const now = performance.now();
    const other = this.#heap.ordered().find((b) => b !== from && !b.paused && b.retryNotBefore <= now);
    return other === undefined ? undefined : this.#take(other);
  }

  /** Hands eligible backends to waiting acquires, oldest first, re-reading the heap after each placement. */
  #wake(): void {
    while (this.#waiters.length > 0) {
      const result = this.#heap.pick(this.#backends.size);
      if (result.type !== 'pick') return;
      const waiter = this.#waiters.shift()!;
      waiter.cleanup();
      waiter.resolve(this.#take(this.#preferReady(result.backend)));
    }
  }

  #leave(backend: BackendState, lease: PoolLease): void {
    if (lease.released) this.#leases.delete(lease);
    this.#heap.update(backend, eligible, (b) => b.inflightTrajectories--);
    if (backend.inflightTrajectories === 0) for (const resolve of backend.drainWaiters.splice(0)) resolve();
  }

  async #send(backend: BackendState, request: GenerateRequest, priority: number): Promise<GenerateResult & SampledVersions> {
    const result = await this.#sendOnce(backend, request, priority);
    if (result.finishReason === 'length' && result.tokenIds.length < request.maxTokens) await checkShortLength(this.#shortLength, backend, request, result);
    return result;
  }

  async #sendOnce(backend: BackendState, request: GenerateRequest, priority: number): Promise<GenerateResult & SampledVersions> {
    const { signal } = request;
    this.#checkLogprobs(backend, request);
    this.#heap.update(backend, eligible, (b) => b.inflightRequests++);
    try {
      const inflight = await this.#admit(backend, signal, priority);
      const { controller } = inflight;
      const onAbort = (): void => controller.abort(signal.reason);
      signal.addEventListener('abort', onAbort, { once: true });
      try {
        throwIfAborted(signal);
        const result = await backend.client.generate({ ...request, signal: controller.signal, pausedMs: () => backend.gate.closedMs() });
        backend.lastAnswerAt = performance.now();
        // Read when the answer arrives: versions change only in resume, so this is the version of its last token.
        return { ...result, policyVersionStart: inflight.policyVersionStart, policyVersion: backend.policyVersion };
      } catch (err) {
        // An answer, even an error one, is the engine at work (see StallWatchdog); a lost connection or an abort is not.
        if (!controller.signal.aborted && !(err instanceof EngineUnreachableError)) backend.lastAnswerAt = performance.now();
        if (signal.aborted) throw RolloutError.from(signal.reason, 'cancelled');
        if (controller.signal.reason instanceof BackendGone) throw controller.signal.reason;
        // The engine's limit was unknown or has changed (restarted with another --max-model-len): learn it.
        if (err instanceof ContextOverflowError && err.maxModelLen !== backend.maxModelLen) {
          this.#limits.setMaxModelLen(backend, err.maxModelLen, 'context-length answer');
        }
        if (err instanceof EngineUnreachableError) {
          await this.#suspect(backend, err);
          throw new BackendGone(backend.id, 'unreachable', { cause: err });
        }
        // An answer meant for another request (a proxy mixing answers up): a transport fault, asked again like a lost
        // backend (PoolLease), on another engine when there is one; its connection is already closed (EngineHttp.exchange).
        if (err instanceof EngineMisdeliveredError) {
          backend.misdeliveredAnswers++;
          this.#log.warn({ backend: backend.id, err }, 'engine answer meant for another request refused; the request is asked again');
          throw new BackendGone(backend.id, 'misdelivered', { cause: err });
        }
        throw err instanceof BackendGone ? err : RolloutError.from(err, 'backend_error');
      } finally {
        signal.removeEventListener('abort', onAbort);
        backend.requests.delete(inflight);
        inflight.end();
        backend.slots.release();
      }
    } finally {
      this.#heap.update(backend, eligible, (b) => b.inflightRequests--);
    }
  }

  /**
   * Waits until a request may go to the engine — the pause gate open, then a slot — and enters it in the
   * backend's requests in the same step as the last check, so a pause sees every request its engine may get. A
   * request that got its slot while a pause began gives it back and waits at the gate again.
   */
  async #admit(backend: BackendState, signal: AbortSignal, priority: number): Promise<InflightRequest> {
    for (;;) {
      if (!backend.usable) throw new BackendGone(backend.id, backend.unusableWhy);
      await backend.gate.pass(signal);
      await backend.slots.acquire(signal, priority);
      if (!backend.paused && backend.usable) {
        if (backend.requests.size === 0) backend.busySince = performance.now();
        const inflight = new InflightRequest(backend.policyVersion);
        backend.requests.add(inflight);
        return inflight;
      }
      backend.slots.release();
    }
  }
}
