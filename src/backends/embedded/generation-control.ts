import { RolloutError } from '../../errors.js';
import type { PauseMode } from '../types.js';

/** One generation the control knows about: the sampling loop asks it, between tokens, whether to go on. */
export interface ControlledGeneration {
  readonly requestId: string | undefined;
  /** Set by an abort (by id, all, or a pause in abort mode): the loop ends with finish_reason "abort". */
  readonly aborted: boolean;
  /**
   * Fires with {@link aborted}, so that an abort also ends the waits before the generation has a sequence (for the
   * model, at the pause gate, for a sequence), which no checkpoint sees.
   */
  readonly stopped: AbortSignal;
  /** Checkpoints passed: the tokens sampled so far (the first checkpoint comes before any). */
  readonly checkpoints: number;
}

interface Entry extends ControlledGeneration {
  aborted: boolean;
  checkpoints: number;
  readonly stop: AbortController;
  /** Wakes the loop if it is frozen by a keep pause. */
  wake?: () => void;
}

/**
 * Pause, resume and abort for an in-process engine, with the semantics vLLM's dev-mode routes have (see PauseMode):
 * while paused, new generations wait in {@link admit}; `abort` ends the generations in flight (those still waiting
 * for a sequence too) after their current token with what they sampled; `wait` resolves once the running ones have
 * finished; `keep` freezes them between two tokens (the sequence's KV cache stays) until {@link resume}. A request
 * calls {@link begin} on arrival (an abort by id must find it while it waits), {@link start} once it has its
 * sequence, {@link checkpoint} before each token and {@link end} when it is over. {@link close} fails every wait.
 */
export class GenerationControl {
  #paused: PauseMode | undefined;
  #closed = false;
  /** Begun, without a sequence yet: waiting for the model, at the pause gate or for a sequence. */
  readonly #waiting = new Set<Entry>();
  readonly #running = new Set<Entry>();
  readonly #admitWaiters = new Set<() => void>();
  /** Woken whenever a generation ends or freezes, for pauses waiting on them. */
  readonly #changeWaiters: Array<() => void> = [];

  get paused(): boolean {
    return this.#paused !== undefined;
  }

  /** The generations running now (for statistics and tests). */
  running(): readonly ControlledGeneration[] {
    return [...this.#running];
  }

  /**
   * Resolves when the engine is not paused; rejects with the signal's reason if it fires first, with backend_error
   * once the control is closed.
   */
  async admit(signal: AbortSignal): Promise<void> {
    for (;;) {
      if (this.#closed) throw closedError();
      if (this.#paused === undefined) return;
      await this.#until(this.#admitWaiters, signal);
    }
  }

  /** Registers a request on arrival; call {@link end} when it is over, whatever ends it. */
  begin(requestId: string | undefined): ControlledGeneration {
    const stop = new AbortController();
    const entry: Entry = { requestId, aborted: false, stopped: stop.signal, stop, checkpoints: 0 };
    this.#waiting.add(entry);
    return entry;
  }

  /** The request has its sequence: from now on it counts as running (pauses wait for it, keep freezes it). */
  start(generation: ControlledGeneration): void {
    this.#waiting.delete(generation as Entry);
    this.#running.add(generation as Entry);
  }

  end(generation: ControlledGeneration): void {
    this.#waiting.delete(generation as Entry);
    this.#running.delete(generation as Entry);
    this.#changed();
  }

  /**
   * Before each token: waits while a keep pause freezes generation (unless the generation is aborted meanwhile);
   * returns false when the generation must end now as aborted; throws backend_error once the control is closed.
   */
  async checkpoint(generation: ControlledGeneration, signal: AbortSignal): Promise<boolean> {
    const entry = generation as Entry;
    entry.checkpoints++;
    while (this.#paused === 'keep' && !entry.aborted && !this.#closed) {
      await new Promise<void>((resolve, reject) => {
        const onAbort = (): void => reject(RolloutError.from(signal.reason, 'cancelled'));
        if (signal.aborted) return onAbort();
        signal.addEventListener('abort', onAbort, { once: true });
        entry.wake = () => {
          signal.removeEventListener('abort', onAbort);
          entry.wake = undefined;
          resolve();
        };
        this.#changed();
      });
    }
    if (this.#closed) throw closedError();
    return !entry.aborted;
  }

  /**
   * Aborts the generations in flight with these request ids (unknown ids are ignored), or all of them: running
   * ones end at their next checkpoint, waiting ones at once, through {@link ControlledGeneration.stopped}.
   */
  abort(requestIds?: readonly string[]): void {
    const ids = requestIds === undefined ? undefined : new Set(requestIds);
    for (const entry of [...this.#waiting, ...this.#running]) {
      if (ids !== undefined && (entry.requestId === undefined || !ids.has(entry.requestId))) continue;
      entry.aborted = true;
      entry.stop.abort(new RolloutError('cancelled', 'generation aborted'));
      entry.wake?.();
    }
  }

  /**
   * Pauses; resolves once the pause holds: `abort` at once (the generations end after their current token),
   * `wait` once every running generation has finished, `keep` once every one is frozen at its checkpoint. A `wait`
   * pause after a `keep` one lets the frozen generations go on, since it waits for them to finish.
   */
  async pause(mode: PauseMode, signal: AbortSignal): Promise<void> {
    this.#paused = mode;
    if (mode === 'abort') this.abort();
    else if (mode === 'wait') for (const entry of this.#running) entry.wake?.();
    const holds = mode === 'wait' ? () => this.#running.size === 0 : () => [...this.#running].every((e) => e.wake !== undefined || e.aborted);
    while (mode !== 'abort' && this.#paused === mode && !holds()) {
      await new Promise<void>((resolve, reject) => {
        const onAbort = (): void => reject(RolloutError.from(signal.reason, 'cancelled'));
        if (signal.aborted) return onAbort();
        signal.addEventListener('abort', onAbort, { once: true });
        this.#changeWaiters.push(() => {
          signal.removeEventListener('abort', onAbort);
          resolve();
        });
      });
    }
  }

  resume(): void {
    this.#paused = undefined;
    this.#wakeAll();
  }

  /**
   * The engine is closing: requests held by a pause and generations frozen by one fail with backend_error (as
   * requests waiting for a sequence do), and so do later admits and checkpoints.
   */
  close(): void {
    this.#closed = true;
    this.#wakeAll();
  }

  /** Wakes every waiter (held, frozen, pausing); each re-checks what it waits for. */
  #wakeAll(): void {
    this.#changed();
    for (const entry of this.#running) entry.wake?.();
    const waiters = [...this.#admitWaiters];
    this.#admitWaiters.clear();
    for (const wake of waiters) wake();
  }

  #changed(): void {
    for (const wake of this.#changeWaiters.splice(0)) wake();
  }

  #until(waiters: Set<() => void>, signal: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      if (signal.aborted) return reject(RolloutError.from(signal.reason, 'cancelled'));
      const wake = (): void => {
        signal.removeEventListener('abort', onAbort);
        resolve();
      };
      const onAbort = (): void => {
        waiters.delete(wake);
        reject(RolloutError.from(signal.reason, 'cancelled'));
      };
      signal.addEventListener('abort', onAbort, { once: true });
      waiters.add(wake);
    });
  }
}

/** What every wait fails with once the engine closes (the same as SequenceSlots'). */
function closedError(): RolloutError {
  return new RolloutError('backend_error', 'embedded engine is closed');
}
