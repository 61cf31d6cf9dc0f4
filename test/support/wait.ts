import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Polls `condition` until it holds, failing with `what` after `timeoutMs`. Tests wait for outcomes with this
 * instead of fixed sleeps, so they stay robust on a loaded CI box (generous timeout, no tight timing).
 */
export async function eventually(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(10);
  }
}

/** Rejects with `what` if `promise` has not settled within `timeoutMs`: a hang becomes a test failure, not a stuck run. */
export async function within<T>(promise: Promise<T>, timeoutMs: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not settle within ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** A promise with its resolve exposed: stage functions in tests wait on gates the test opens. */
export interface Gate {
  readonly promise: Promise<void>;
  open(): void;
  readonly opened: boolean;
}

export function gate(): Gate {
  let resolve!: () => void;
  let opened = false;
  const promise = new Promise<void>((r) => (resolve = r));
  return {
    promise,
    open: () => {
      opened = true;
      resolve();
    },
    get opened() {
      return opened;
    },
  };
}

/** Resolves after `ms`, or rejects with the signal's reason when it fires first (a stage that honours its signal). */
export function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return sleep(ms, undefined, { signal });
}
