import type { ResolvedLimits } from './task.js';

/** The smallest and largest policy version among a trajectory's sampled spans (start and end versions). */
export interface VersionRange {
  policyVersionMin: number;
  policyVersionMax: number;
}

/**
 * How far the policy versions inside one trajectory differ: max − min over the versions that sampled its tokens
 * (each span's start and end version, so a span a KEEP pause froze across an update counts both). An off-policy
 * trainer bounds it with TaskLimits.max_staleness.
 */
export function staleness(range: VersionRange): number {
  return range.policyVersionMax - range.policyVersionMin;
}

/** True when the task bounds staleness and the trajectory's versions differ by more than the bound. */
export function exceedsStaleness(limits: Pick<ResolvedLimits, 'maxStaleness'>, range: VersionRange): boolean {
  return limits.maxStaleness !== undefined && staleness(range) > limits.maxStaleness;
}

/**
 * A running min/max of the versions seen so far, so the agent loop can tell mid-run that a sample to be restarted
 * is already past its bound (versions only accumulate: the rest of the run cannot bring it back).
 */
export class VersionTracker implements VersionRange {
  policyVersionMin = 0;
  policyVersionMax = 0;
  #seen = false;

  add(...versions: number[]): void {
    for (const v of versions) {
      this.policyVersionMin = this.#seen ? Math.min(this.policyVersionMin, v) : v;
      this.policyVersionMax = this.#seen ? Math.max(this.policyVersionMax, v) : v;
      this.#seen = true;
    }
  }
}
