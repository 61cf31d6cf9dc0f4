import { RolloutError } from '../../errors.js';
import type { PauseMode } from '../types.js';

/** One generation the control knows about: the sampling loop asks it, between tokens, whether to go on. */
export interface ControlledGeneration {
  readonly requestId: string | undefined;
  /** Set by an abort (by id, all, or a pause in abort mode): the loop ends with finish_reason "abort". */
  readonly aborted: boolean;
  /** Checkpoints passed: the tokens sampled so far (the first checkpoint comes before any). */
  readonly checkpoints: number;
}

interface Entry extends ControlledGeneration {
  aborted: boolean;
  checkpoints: number;
  /** Wakes the loop if it is frozen by a keep pause. */
  wake?: () => void;
}

/**
 * Pause, resume and abort for an in-process engine, with the semantics vLLM's dev-mode routes have (see PauseMode):
 * while paused, new generations wait in {@link admit}; `abort` ends the running ones after their current token
 * with what they sampled; `wait` resolves once they have finished; `keep` freezes them between two tokens (the
 * sequence's KV cache stays) until {@link resume}. The sampling loop calls {@link begin} once and
 * {@link checkpoint} before each token.
 */
export class GenerationControl {
  #paused: PauseMode | undefined;
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

  /** Resolves when the engine is not paused; rejects with the signal's reason if it fires first. */
  async admit(signal: AbortSignal): Promise<void> {
    while (this.#paused !== undefined) await this.#until(this.#admitWaiters, signal);
  }

  /** Registers a generation; call {@link end} when it is over, whatever ends it. */
  begin(requestId: string | undefined): ControlledGeneration {
    const entry: Entry = { requestId, aborted: false, checkpoints: 0 };
    this.#running.add(entry);
    return entry;
  }

  end(generation: ControlledGeneration): void {
    this.#running.delete(generation as Entry);
    this.#changed();
  }

  /**
   * Before each token: waits while a keep pause freezes generation (unless the generation is aborted meanwhile);
   * returns false when the generation must end now as aborted.
   */
  async checkpoint(generation: ControlledGeneration, signal: AbortSignal): Promise<boolean> {
    const entry = generation as Entry;
    entry.checkpoints++;
    while (this.#paused === 'keep' && !entry.aborted) {
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
    return !entry.aborted;
  }

  /** Aborts the running generations with these request ids (unknown ids are ignored), or all of them. */
  abort(requestIds?: readonly string[]): void {
    const ids = requestIds === undefined ? undefined : new Set(requestIds);
    for (const entry of this.#running) {
      if (ids !== undefined && (entry.requestId === undefined || !ids.has(entry.requestId))) continue;
      entry.aborted = true;
      entry.wake?.();
    }
  }

  /**
   * Pauses; resolves once the pause holds: `abort` at once (the generations end after their current token),
   * `wait` once every running generation has finished, `keep` once every one is frozen at its checkpoint.
   */
  async pause(mode: PauseMode, signal: AbortSignal): Promise<void> {
    this.#paused = mode;
    if (mode === 'abort') this.abort();
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
