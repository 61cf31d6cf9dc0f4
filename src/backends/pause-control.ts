import { RolloutError, throwIfAborted } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import type { BackendState } from './backend-state.js';
import { backendKind } from './kinds.js';
import type { EngineClient, PauseMode } from './types.js';

/** How {@link pauseBackends} runs. */
export interface PauseOptions {
  /** The caller's signal (the RPC's deadline): a WAIT pause that outlives it stops waiting, the backends stay paused. */
  signal: AbortSignal;
  /** How long an ABORT pause waits for the aborted requests to come back before it answers anyway. */
  abortGraceMs: number;
  log: Logger;
  /** Called once the mode is known to be possible on every target, before any of them pauses. */
  beforePause?: () => void;
  /**
   * A pool-wide call: a target that is down (unhealthy) has its gate closed but its engine is not called, so one dead
   * engine left in the pool neither fails nor stalls every weight sync. A call naming one backend calls it anyway.
   */
  skipUnhealthy?: boolean;
}

/**
 * Pauses generation on `targets` (the pool's half of PauseGeneration). At once, each backend's gate closes: new
 * requests wait in the pool (see PauseGate) and trajectories stay where they are. Then, by `mode`:
 * - `wait`: resolves once the requests in flight have finished. The pool waits for its own requests, so this works
 *   on every engine (SGLang and engines without a pause included); an engine with a wait mode of its own is then
 *   paused with it too, so that requests from other clients also stop.
 * - `abort`: the engine aborts the requests in flight; they come back with finish_reason "abort" and what they had
 *   sampled, and the agent loop continues the turn after resume. Resolves once they are back (bounded by
 *   `abortGraceMs`: a request that reached the engine only after it paused is held there until resume), so they are
 *   recorded with the version that sampled them before a resume can change it.
 * - `keep`: the engine freezes the requests in flight (KV cache kept); they continue after resume, and a version set
 *   by that resume is recorded as their end version (see SampledVersions).
 *
 * Throws failed_precondition, pausing nothing, when an engine lacks the mode (abort and keep need the engine, see
 * kinds.ts). An engine whose pause call fails is left unpaused and named in the error (failed_precondition), the
 * others stay paused until resumed. A resume that starts while this pause is still under way wins: the pause does
 * not pause that engine (or, if its engine call was already out, resumes it again once that call returns), and the
 * pause answers `aborted` naming it. A target removed from the pool while the pause is under way (RemoveBackend)
 * is no longer its business: not called, not named in an error. Returns the targets still in the pool.
 */
export async function pauseBackends(targets: readonly BackendState[], mode: PauseMode, options: PauseOptions): Promise<readonly BackendState[]> {
  const { signal, log } = options;
  const unable = mode === 'wait' ? [] : targets.filter((b) => !enginePauses(b.client, mode));
  if (unable.length > 0) {
    const names = unable.map((b) => `${b.id} (${b.client.kind})`).join(', ');
    throw new RolloutError('failed_precondition', `cannot pause in ${mode} mode: ${names} cannot; nothing was paused`);
  }
  options.beforePause?.();
  const started = targets.map((b) => {
    b.gate.close();
    b.pauses++;
    // A resume owed to an engine that was down at the last resume (resumePending) is not due while this pause is in
    // effect: its recovery must not resume the engine and open its gate in the middle of a weight update. The resume
    // that ends this pause takes it over (resumed then, or pending again if the engine is still down).
    const resumePending = b.resumePending;
    b.resumePending = false;
    return { pauses: b.pauses, resumes: b.resumes, resumePending };
  });
  const skipped = options.skipUnhealthy ? targets.filter((b) => !b.usable) : [];
  if (skipped.length > 0) log.warn({ backends: skipped.map((b) => b.id), mode }, 'unhealthy backends held at their gates, their engines not paused');
  log.info({ backends: targets.map((b) => b.id), mode }, 'generation pausing');
  const results = await Promise.allSettled(targets.map((b, i) => (skipped.includes(b) ? Promise.resolve() : pauseEngine(b, mode, options, started[i]!.resumes, started[i]!.pauses))));
  throwIfAborted(signal);
  const failed = targets.filter((b, i) => results[i]!.status === 'rejected' && !b.removed);
  if (failed.length > 0) {
    for (const backend of failed) {
      const own = started[targets.indexOf(backend)]!;
      if (backend.pauses !== own.pauses) continue; // a later pause decides
      // Left as it was: a resume it owed is owed again, and a gate this pause closed on a running engine opens.
      if (own.resumePending) backend.resumePending = true;
      if (!backend.enginePaused) backend.gate.open();
    }
    const first: unknown = (results.find((r) => r.status === 'rejected') as PromiseRejectedResult).reason;
    const names = failed.map((b) => b.id).join(', ');
    throw new RolloutError('failed_precondition', `could not pause ${names} in ${mode} mode (left unpaused): ${RolloutError.from(first).message}`, { cause: first });
  }
  // remove() resumes a paused engine on its way out, which is no resume of the caller's to report.
  const superseded = targets.filter((b, i) => b.resumes !== started[i]!.resumes && !b.removed);
  if (superseded.length > 0) {
    const names = superseded.map((b) => b.id).join(', ');
    throw new RolloutError('aborted', `the pause of ${names} was superseded by a ResumeGeneration that started while it was pausing: ${names} not paused`);
  }
  const remaining = targets.filter((b) => !b.removed);
  log.info({ backends: remaining.map((b) => b.id), mode }, 'generation paused');
  return remaining;
}

/** How {@link resumeBackends} runs. */
export interface ResumeOptions {
  signal: AbortSignal;
  /** The policy version the engines serve from now on; unset keeps theirs. */
  policyVersion?: number;
  log: Logger;
  /**
   * A pool-wide call: a target that is down (unhealthy) is not called; an engine of it this pool paused is resumed
   * when it is healthy again (`resumePending`), its gate closed until then. A call naming one backend calls it anyway.
   */
  skipUnhealthy?: boolean;
}

/**
 * Resumes generation on `targets` (the pool's half of ResumeGeneration). The policy version, when given, is set
 * first — while the engines are still paused —, so every token sampled after the resume is recorded with it; then
 * each engine is resumed and its gate opens (held requests go, oldest first). An engine this pool paused must
 * resume: one whose resume call fails stays paused and is named in the error (unavailable): retry the resume. An
 * engine this pool did not pause is asked to resume too, and its failure ignored (engines' resume calls are
 * idempotent): a trainer whose rollout server restarted between its pause and its resume would otherwise find the
 * engines still paused by the server before, and every request held there until its timeout. A pause that started
 * after this resume keeps its gate closed.
 */
export async function resumeBackends(targets: readonly BackendState[], options: ResumeOptions): Promise<readonly BackendState[]> {
  const { policyVersion, signal, log } = options;
  const pausesAtStart = targets.map((b) => {
    b.resumes++;
    return b.pauses;
  });
  if (policyVersion !== undefined) for (const backend of targets) backend.policyVersion = policyVersion;
  const down = options.skipUnhealthy ? targets.filter((b) => !b.usable) : [];
  const results = await Promise.allSettled(
    targets.map(async (backend, i) => {
      if (down.includes(backend)) {
        if (backend.enginePaused) {
          backend.resumePending = true;
          return;
        }
      } else {
        await resumeEngine(backend, signal, log);
        if (backend.pauses === pausesAtStart[i]) backend.resumePending = false;
      }
      if (backend.pauses === pausesAtStart[i]) backend.gate.open();
    }),
  );
  const pending = down.filter((b) => b.resumePending);
  if (pending.length > 0) log.warn({ backends: pending.map((b) => b.id) }, 'unhealthy backends stay paused: their engines are resumed when they are healthy again');
  const failed = targets.filter((_, i) => results[i]!.status === 'rejected');
  if (failed.length > 0) {
    const first: unknown = (results.find((r) => r.status === 'rejected') as PromiseRejectedResult).reason;
    throw new RolloutError('unavailable', `could not resume ${failed.map((b) => b.id).join(', ')} (still paused): ${RolloutError.from(first).message}`, { cause: first });
  }
  log.info({ backends: targets.map((b) => b.id), policyVersion }, 'generation resumed');
  return targets;
}

async function pauseEngine(backend: BackendState, mode: PauseMode, options: PauseOptions, resumesAtStart: number, ownPauses: number): Promise<void> {
  const { signal, log } = options;
  const superseded = (): boolean => backend.resumes !== resumesAtStart;
  // The gate is closed and a request re-checks it when it takes its slot, so no new request reaches the engine:
  // these are all the requests the pause concerns.
  const inflight = [...backend.requests].map((r) => r.ended);
  if (mode === 'wait') {
    await untilSettled(inflight, signal);
    if (!enginePauses(backend.client, 'wait')) return;
  }
  // Removed meanwhile (its client closed): nothing to pause.
  if (superseded() || backend.removed) return;
  try {
    await engineCall(backend, 'pause', signal, async (callSignal) => {
      if (superseded()) return;
      try {
        await backend.client.pause!(mode, callSignal);
      } catch (err) {
        // Cut short by the resume that overtook it: the engine may have paused; that resume resumes it next.
        if (superseded()) backend.enginePaused = true;
        throw err;
      }
      backend.enginePaused = true;
      if (callSignal.aborted) {
        // Answered after it was given up (a client that does not honour aborts): the resume that overtook it may have
        // reached the engine first. Resume again, unless a later pause wants it paused.
        if (backend.pauses !== ownPauses) return;
        backend.gate.close();
        void resumeHeld(backend, AbortSignal.timeout(30_000), log).catch((err: unknown) =>
          log.warn({ backend: backend.id, err }, 'could not resume an engine whose overtaken pause answered late: retried at its next health probe'),
        );
        return;
      }
      backend.resumePending = false;
    });
  } catch (err) {
    if (superseded()) return; // the pause answers ABORTED (see pauseBackends)
    throw err;
  }
  if (mode !== 'abort' || superseded()) return;
  const timer = AbortSignal.timeout(options.abortGraceMs);
  try {
    await untilSettled(inflight, AbortSignal.any([signal, timer]));
  } catch (err) {
    if (!timer.aborted || signal.aborted) throw err;
    options.log.warn({ backend: backend.id, graceMs: options.abortGraceMs }, 'aborted requests did not all come back in time; paused anyway');
  }
}

/**
 * Resumes the engine: one this pool paused (or may have: a pause call cut short, a server restarted during a pause)
 * must resume, and a failure is thrown; any other engine that can pause is asked too and its failure ignored
 * (resume is idempotent: another server may have left it paused).
 */
export async function resumeEngine(backend: BackendState, signal: AbortSignal, log: Logger): Promise<void> {
  await engineCall(backend, 'resume', signal, async (callSignal) => {
    if (backend.enginePaused) {
      await backend.client.resume!(callSignal);
      backend.enginePaused = false;
    } else if (backend.client.resume && enginePausesAtAll(backend.client)) {
      await backend.client.resume(callSignal).catch((err: unknown) => log.debug({ backend: backend.id, err }, 'resume of an engine this pool had not paused failed (ignored)'));
    }
  });
}

/**
 * Resumes the engine of a backend held at its gate and opens the gate, unless a pause or resume started meanwhile
 * (that call decides) or the backend was removed; resolves whether it opened it. If the engine cannot be reached,
 * the backend is marked `resumePending` (the pool retries at its health probes; not when a pause or resume started
 * meanwhile) and the error is thrown.
 */
export async function resumeHeld(backend: BackendState, signal: AbortSignal, log: Logger): Promise<boolean> {
  const { pauses, resumes } = backend;
  try {
    await resumeEngine(backend, signal, log);
  } catch (err) {
    // Retried at the next probe — unless a pause or resume started meanwhile: that call decides (a pause wants the
    // engine paused; a resume resumes it, or marks it pending itself).
    if (backend.pauses === pauses && backend.resumes === resumes) backend.resumePending = true;
    throw err;
  }
  if (backend.pauses !== pauses || backend.resumes !== resumes || backend.removed) return false;
  backend.resumePending = false;
  backend.gate.open();
  return true;
}

/**
 * Runs one engine pause or resume call of this pool after the one in flight has settled, so the engine sees them in
 * the pool's order and `enginePaused` (set inside `call`) always says what the last one did. A resume overtaking a
 * pause call still out aborts it rather than wait for an engine that may not answer.
 */
async function engineCall(backend: BackendState, kind: 'pause' | 'resume', signal: AbortSignal, call: (signal: AbortSignal) => Promise<void>): Promise<void> {
  const previous = backend.engineCall;
  if (kind === 'resume' && previous?.kind === 'pause') previous.controller.abort(new RolloutError('aborted', 'overtaken by a resume'));
  const controller = new AbortController();
  const run = (async () => {
    await previous?.settled;
    throwIfAborted(controller.signal);
    const callSignal = AbortSignal.any([signal, controller.signal]);
    // Settles when aborted even if the client does not honour the signal: the next call must not wait on it.
    await Promise.race([call(callSignal), new Promise<never>((_, reject) => callSignal.addEventListener('abort', () => reject(RolloutError.from(callSignal.reason, 'aborted')), { once: true }))]);
  })();
  const entry = { kind, controller, settled: run.then(noop, noop) };
  backend.engineCall = entry;
  void entry.settled.then(() => {
    if (backend.engineCall === entry) backend.engineCall = undefined;
  });
  await run;
}

const noop = (): void => undefined;

/** Whether the engine can pause itself in some mode (so it has a pause another server may have left on). */
export function enginePausesAtAll(client: EngineClient): boolean {
  return client.pause !== undefined && client.resume !== undefined && backendKind(client.kind).capabilities.pauseModes.length > 0;
}

/** Whether the engine implements a pause mode itself (kinds.ts capabilities, and the client has the calls). */
export function enginePauses(client: EngineClient, mode: PauseMode): boolean {
  return client.pause !== undefined && client.resume !== undefined && backendKind(client.kind).capabilities.pauseModes.includes(mode);
}

/** Resolves once every promise has settled; rejects with the signal's reason if it fires first. */
async function untilSettled(promises: readonly Promise<unknown>[], signal: AbortSignal): Promise<void> {
  throwIfAborted(signal);
  let onAbort = (): void => undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(RolloutError.from(signal.reason, 'cancelled'));
    signal.addEventListener('abort', onAbort, { once: true });
  });
  try {
    await Promise.race([Promise.allSettled(promises), aborted]);
  } finally {
    signal.removeEventListener('abort', onAbort);
  }
}
