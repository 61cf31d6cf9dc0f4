import { RolloutError } from '../errors.js';

/**
 * Resolves or rejects with `work`, or rejects with the signal's reason as soon as it fires, whichever is first.
 * Frees a stage slot even when the stage's code ignores its AbortSignal, so a stuck sample never stalls a pool.
 */
export function raceAbort<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) {
    work.catch(() => undefined);
    return Promise.reject(RolloutError.from(signal.reason, 'cancelled'));
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(RolloutError.from(signal.reason, 'cancelled'));
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err);
      },
    );
  });
}

/**
 * A controller that also aborts (with the parent's reason) when `parent` does, so one unit of work can be
 * aborted on its own or with everything under the parent. `dispose` detaches it from the parent.
 */
export function linkedController(parent: AbortSignal): { controller: AbortController; dispose: () => void } {
  const controller = new AbortController();
  const onParent = (): void => controller.abort(parent.reason);
  if (parent.aborted) controller.abort(parent.reason);
  else parent.addEventListener('abort', onParent, { once: true });
  return { controller, dispose: () => parent.removeEventListener('abort', onParent) };
}

