import { minimumSeconds } from './critical-path.js';
import type { EngineModel } from './sim-engine.js';
import type { PolicyReport } from './simulate.js';
import type { TrajectorySpec } from './workload.js';

/**
 * The simulator's own invariants, whatever the policy: every trajectory finished with one served turn per
 * planned turn and a non-negative duration; no engine ever ran more sequences than it has; a prefix-cache hit
 * happened only on the engine that served the trajectory's previous turn; a sticky policy never moved a
 * trajectory (no engine fails in this simulation); no trajectory ran faster than it could alone on the fastest
 * idle engine (critical-path.ts). Returns what is wrong, empty when all hold.
 */
export function invariantProblems(report: PolicyReport, workload: readonly TrajectorySpec[], engines: readonly EngineModel[]): string[] {
  const problems: string[] = [];
  const unfinished = workload.filter((t) => {
    const r = report.trajectories[t.index];
    return r === undefined || !(r.end >= r.start) || r.engines.length !== t.outputTokens.length;
  });
  if (unfinished.length > 0) problems.push(`${unfinished.length} trajectories did not finish all their turns (e.g. #${unfinished[0]!.index})`);
  const tooFast = workload.filter((t) => {
    const r = report.trajectories[t.index];
    return r !== undefined && r.end - r.start < minimumSeconds(t, engines) * (1 - 1e-9);
  });
  if (tooFast.length > 0) problems.push(`${tooFast.length} trajectories ran faster than alone on the fastest idle engine (e.g. #${tooFast[0]!.index})`);
  for (const e of report.engines) {
    if (e.overCapacity > 0 || e.maxRunning > e.maxSequences) problems.push(`${e.id} ran ${e.maxRunning} sequences (max ${e.maxSequences})`);
    if (e.hitsOffSticky > 0) problems.push(`${e.id}: ${e.hitsOffSticky} cache hits for trajectories whose previous turn ran elsewhere`);
    if (e.cachedTokens > e.promptTokens) problems.push(`${e.id}: more cached than prompt tokens`);
  }
  const sticky = ['capacity-heap', 'capacity-heap-fifo', 'cumulative-count', 'consistent-hash'].includes(report.policy);
  if (sticky && report.moves > 0) problems.push(`sticky policy moved ${report.moves} turns`);
  return problems;
}
