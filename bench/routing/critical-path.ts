import type { EngineModel } from './sim-engine.js';
import type { PolicyReport } from './simulate.js';
import type { TrajectorySpec } from './workload.js';

/**
 * The least virtual time a trajectory can take on these engines, whatever the routing: its tool time plus its
 * service (every output token, and a quarter-cost prefill of its first prompt and of each observation, the
 * rest of each context being a cache hit on the sticky engine) at the speed of the fastest engine running it
 * alone (`peak / (1 + halfBatch)`; a batch only slows a sequence). No run can beat it: a shorter duration
 * means the simulator is wrong.
 */
export function minimumSeconds(spec: TrajectorySpec, engines: readonly EngineModel[]): number {
  const sum = (xs: readonly number[]): number => xs.reduce((a, b) => a + b, 0);
  const fastest = Math.max(...engines.map((e) => e.peakTokensPerSecond / (1 + e.halfBatch)));
  const prefill = Math.min(...engines.map((e) => e.prefillCostPerToken));
  const service = sum(spec.outputTokens) + prefill * (spec.promptTokens + sum(spec.observationTokens));
  return sum(spec.toolSeconds) + service / fastest;
}

/** How the step ended under one policy: the trajectory that finished last, and how early it could have. */
export interface StepEnd {
  /** Index of the trajectory that ended the step. */
  trajectory: number;
  turns: number;
  /** When it started, and the share of the makespan that had passed by then. */
  start: number;
  startShare: number;
  /** How long it ran, and the least it could have taken alone on the fastest idle engine. */
  ran: number;
  alone: number;
  /**
   * max over trajectories of start + alone: with the starts this run had, no routing could end the step sooner.
   * (Starts depend on routing too: a trajectory starts when an earlier one ends.)
   */
  bound: number;
  /** The utilisation this run's busy time would have at `bound`: the most any placement could add from the same starts. */
  utilisationAtBound: number;
}

export function stepEnd(report: PolicyReport, workload: readonly TrajectorySpec[], engines: readonly EngineModel[]): StepEnd {
  let last = 0;
  let bound = 0;
  for (const spec of workload) {
    const r = report.trajectories[spec.index]!;
    if (r.end > report.trajectories[last]!.end) last = spec.index;
    bound = Math.max(bound, r.start + minimumSeconds(spec, engines));
  }
  const r = report.trajectories[last]!;
  return {
    trajectory: last,
    turns: workload[last]!.outputTokens.length,
    start: r.start,
    startShare: r.start / report.makespan,
    ran: r.end - r.start,
    alone: minimumSeconds(workload[last]!, engines),
    bound,
    utilisationAtBound: Math.min(1, (report.utilisation * report.makespan) / bound),
  };
}
