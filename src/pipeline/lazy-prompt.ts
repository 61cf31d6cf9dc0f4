import type { TokenIds } from '../backends/types.js';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { attachedVarints, attachVarints } from '../tokens/packed-varints.js';
import { toNumberArray } from '../tokens/token-column.js';

/**
 * A trajectory's prompt_token_ids kept as the Int32Array a long prompt came in from its token thread until someone
 * reads the field.
 *
 * Why: the server itself never reads a finished trajectory's prompt ids as numbers — the encoder copies the
 * prompt's packed varints (tokens/packed-varints.ts), the streams send those bytes, the task store keeps only them —
 * yet a 64K-token prompt as a number[] was a fresh 440 KB array built on the event loop per prompt (0.3-0.7 ms,
 * mostly page faults) and a large object on the V8 heap for as long as the trajectory lived. A trajectory built from
 * such a prompt has `promptTokenIds` as an accessor that makes the number[] on its first read (then a plain data
 * property holding it: later reads, writes and spreads see an ordinary field). Code that wants the ids without making
 * them reads {@link promptIdsOf}.
 *
 * Object spreads read every field, so a spread of such a trajectory makes the array: the pipeline builds a
 * trajectory in one object and adds its timing by assignment (trajectory.ts, pipeline.ts).
 */
const packed = new WeakMap<Trajectory, Int32Array>();

/** Sets `trajectory.promptTokenIds` to `ids`: as is for a number[], as a lazily made number[] for an Int32Array. */
export function setPromptTokenIds(trajectory: Trajectory, ids: TokenIds): void {
  if (Array.isArray(ids)) {
    // The ledger's prompt ids, shared (a trajectory is never changed after it is built; wireSafe copies to degrade).
    trajectory.promptTokenIds = ids as number[];
    return;
  }
  const typed = ids as Int32Array;
  packed.set(trajectory, typed);
  const settle = (value: number[]): number[] => {
    packed.delete(trajectory);
    Object.defineProperty(trajectory, 'promptTokenIds', { value, writable: true, enumerable: true, configurable: true });
    return value;
  };
  Object.defineProperty(trajectory, 'promptTokenIds', {
    enumerable: true,
    configurable: true,
    get: () => {
      const array = toNumberArray(typed);
      const varints = attachedVarints(typed);
      if (varints !== undefined) attachVarints(array, varints);
      return settle(array);
    },
    set: (value: number[]) => void settle(value),
  });
}

/** The trajectory's prompt ids without making a number[] of a lazily kept prompt (see {@link setPromptTokenIds}). */
export function promptIdsOf(trajectory: Trajectory): TokenIds {
  return packed.get(trajectory) ?? trajectory.promptTokenIds;
}

/** Whether the trajectory's prompt ids are still the Int32Array they came in (no number[] made yet; for tests). */
export function promptIdsPending(trajectory: Trajectory): boolean {
  return packed.has(trajectory);
}
