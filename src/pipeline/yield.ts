import { setImmediate as immediate } from 'node:timers/promises';

/**
 * Lets the event loop run (timers, sockets, other streams) when this turn of it has already run a while.
 *
 * One incoming message can start a long chain of work on microtasks alone — a new task is admitted, its prompt comes
 * from the cache, init needs no sandbox process, the first engine request is built and written — and such chains held
 * the loop for 5-10 ms at 64K-token contexts and for hundreds of ms with 1,000 short trajectories in flight
 * (bench/orchestration), so a timer or another stream's message waited that long. The pipeline calls this where a
 * sample goes from one step to the next (admission, a stage, an engine request, the delivery):
 *
 *     for (let turn = yieldIfBusy(); turn; turn = yieldIfBusy()) await turn;
 *
 * It returns undefined (go on) unless {@link YIELD_AFTER_MS} passed since the loop last got a turn, else a promise of
 * the loop's next turn, shared by every caller meanwhile. Look again after it: everyone who waited resumes in one
 * chain of microtasks, and each must see the time the ones before it took, or the herd would run as one block.
 */
export function yieldIfBusy(): Promise<void> | undefined {
  if (performance.now() - lastTurn < YIELD_AFTER_MS) return undefined;
  if (!scheduled) {
    scheduled = true;
    next = immediate().then(() => {
      scheduled = false;
      lastTurn = performance.now();
    });
  }
  return next;
}

/** How long a chain of work may hold the event loop before the next step waits for the loop's next turn. */
export const YIELD_AFTER_MS = 2;

/** When the loop last got a turn through this module (or the module was loaded). */
let lastTurn = performance.now();
let scheduled = false;
let next: Promise<void> = Promise.resolve();
