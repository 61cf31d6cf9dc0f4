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
 * others stay paused until resumed. Returns the targets.
 */
export async function pauseBackends(targets: readonly BackendState[], mode: PauseMode, options: PauseOptions): Promise<readonly BackendState[]> {
  const { signal, log } = options;
  const unable = mode === 'wait' ? [] : targets.filter((b) => !enginePauses(b.client, mode));
  if (unable.length > 0) {
    const names = unable.map((b) => `${b.id} (${b.client.kind})`).join(', ');
    throw new RolloutError('failed_precondition', `cannot pause in ${mode} mode: ${names} cannot; nothing was paused`);
  }
  options.beforePause?.();
  for (const backend of targets) backend.gate.close();
  log.info({ backends: targets.map((b) => b.id), mode }, 'generation pausing');
  const results = await Promise.allSettled(targets.map((b) => pauseEngine(b, mode, options)));
  throwIfAborted(signal);
  const failed = targets.filter((_, i) => results[i]!.status === 'rejected');
  if (failed.length > 0) {
    for (const backend of failed) if (!backend.enginePaused) backend.gate.open();
    const first: unknown = (results.find((r) => r.status === 'rejected') as PromiseRejectedResult).reason;
    const names = failed.map((b) => b.id).join(', ');
    throw new RolloutError('failed_precondition', `could not pause ${names} in ${mode} mode (left unpaused): ${RolloutError.from(first).message}`, { cause: first });
  }
  log.info({ backends: targets.map((b) => b.id), mode }, 'generation paused');
  return targets;
}

/** How {@link resumeBackends} runs. */
export interface ResumeOptions {
  signal: AbortSignal;
  /** The policy version the engines serve from now on; unset keeps theirs. */
  policyVersion?: number;
  log: Logger;
}

/**
 * Resumes generation on `targets` (the pool's half of ResumeGeneration). The policy version, when given, is set
 * first — while the engines are still paused —, so every token sampled after the resume is recorded with it; then
 * each engine whose own pause was called is resumed, and its gate opens (held requests go, oldest first). An
 * engine whose resume call fails stays paused and is named in the error (unavailable): retry the resume.
 */
export async function resumeBackends(targets: readonly BackendState[], options: ResumeOptions): Promise<readonly BackendState[]> {
  const { policyVersion, signal, log } = options;
  if (policyVersion !== undefined) for (const backend of targets) backend.policyVersion = policyVersion;
  const results = await Promise.allSettled(
    targets.map(async (backend) => {
      if (backend.enginePaused) {
        await backend.client.resume!(signal);
        backend.enginePaused = false;
      }
      backend.gate.open();
    }),
  );
  const failed = targets.filter((_, i) => results[i]!.status === 'rejected');
  if (failed.length > 0) {
    const first: unknown = (results.find((r) => r.status === 'rejected') as PromiseRejectedResult).reason;
    throw new RolloutError('unavailable', `could not resume ${failed.map((b) => b.id).join(', ')} (still paused): ${RolloutError.from(first).message}`, { cause: first });
  }
  log.info({ backends: targets.map((b) => b.id), policyVersion }, 'generation resumed');
  return targets;
}

async function pauseEngine(backend: BackendState, mode: PauseMode, options: PauseOptions): Promise<void> {
  const { signal } = options;
  // The gate is closed and a request re-checks it when it takes its slot, so no new request reaches the engine:
  // these are all the requests the pause concerns.
  const inflight = [...backend.requests].map((r) => r.ended);
  if (mode === 'wait') {
    await untilSettled(inflight, signal);
    if (!enginePauses(backend.client, 'wait')) return;
  }
  await backend.client.pause!(mode, signal);
  backend.enginePaused = true;
  if (mode !== 'abort') return;
  const timer = AbortSignal.timeout(options.abortGraceMs);
  try {
    await untilSettled(inflight, AbortSignal.any([signal, timer]));
  } catch (err) {
    if (!timer.aborted || signal.aborted) throw err;
    options.log.warn({ backend: backend.id, graceMs: options.abortGraceMs }, 'aborted requests did not all come back in time; paused anyway');
  }
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
