import type { GenerateRequest } from '../../src/backends/types.js';
import { makeRouter, type PolicyName } from './routers.js';
import { SimEngine, type EngineCounters, type EngineModel } from './sim-engine.js';
import { VirtualClock } from './virtual-clock.js';
import type { TrajectorySpec } from './workload.js';

/** One simulated RL step: the engines, the workload and how many trajectories the server runs at once. */
export interface Scenario {
  engines: readonly EngineModel[];
  workload: readonly TrajectorySpec[];
  /** Trajectories in flight at once (the run stage's concurrency); the rest wait in submission order. */
  concurrency: number;
}

export interface EngineReport extends EngineCounters {
  id: string;
  maxSequences: number;
  /** Busy sequence-seconds ÷ (max sequences × makespan). */
  utilisation: number;
  trajectories: number;
}

/** What one policy did with the scenario. Times are virtual seconds. */
export interface PolicyReport {
  policy: PolicyName;
  makespan: number;
  /** Σ busy sequence-seconds ÷ (Σ max sequences × makespan): the capacity the engines actually used. */
  utilisation: number;
  /**
   * The same up to the moment the last trajectory started (while work was still waiting to be admitted): the
   * steady state, without the drain at the end of the step that no placement can avoid once routing is sticky.
   */
  utilisationSaturated: number;
  /** When the last trajectory started. */
  lastStart: number;
  latencyP50: number;
  latencyP90: number;
  latencyMax: number;
  /** Prompt tokens served from the prefix cache ÷ all prompt tokens (first turns included: they always miss). */
  cacheHitRate: number;
  /** Share of the engines' service spent on prefill of uncached prompt tokens (the rest is decoding). */
  prefillShare: number;
  /** Turns served by another engine than the trajectory's previous turn. */
  moves: number;
  engines: EngineReport[];
  /** Every trajectory's [start, end) and the engines of its turns, in order (for the simulator's own checks). */
  trajectories: Array<{ start: number; end: number; engines: string[] }>;
}

export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))]!;
}

/**
 * Runs the scenario once under one policy, in virtual time. Each trajectory is the agent loop reduced to its
 * routing-relevant steps: open a route, then per turn generate (prompt = everything so far) and run its tools,
 * then close the route. Deterministic for a given scenario.
 */
export async function simulate(policy: PolicyName, scenario: Scenario): Promise<PolicyReport> {
  const clock = new VirtualClock();
  const prompts = new Map<number, number>();
  const lastEngine = new Map<number, SimEngine>();
  const turns = {
    describe: (request: GenerateRequest) => {
      const trajectory = request.promptIds[0]!;
      return { trajectory, promptTokens: prompts.get(trajectory)! };
    },
    lastEngine,
  };
  const engines = scenario.engines.map((m) => new SimEngine(m, clock, turns));
  const router = makeRouter(policy, engines);
  const records: PolicyReport['trajectories'] = [];
  const perEngine = new Map<string, number>();
  let moves = 0;
  let lastStart = 0;
  let busyAtLastStart = 0;

  const runOne = async (spec: TrajectorySpec): Promise<void> => {
    const record = { start: clock.now, end: Number.NaN, engines: [] as string[] };
    records[spec.index] = record;
    if (spec.index === scenario.workload.length - 1) {
      lastStart = clock.now;
      busyAtLastStart = engines.reduce((s, e) => s + e.busyNow(), 0);
    }
    const route = await router.open(spec.index);
    let context = spec.promptTokens;
    for (let turn = 0; turn < spec.outputTokens.length; turn++) {
      prompts.set(spec.index, context);
      const signal = new AbortController().signal;
      const engine = await route.generate({ promptIds: [spec.index], maxTokens: spec.outputTokens[turn]!, signal });
      if (turn === 0) perEngine.set(engine, (perEngine.get(engine) ?? 0) + 1);
      else if (engine !== record.engines[turn - 1]) moves++;
      record.engines.push(engine);
      context += spec.outputTokens[turn]!;
      if (turn === spec.outputTokens.length - 1) break;
      await clock.sleep(spec.toolSeconds[turn]!);
      context += spec.observationTokens[turn]!;
    }
    route.close();
    prompts.delete(spec.index);
    lastEngine.get(spec.index)?.forget(spec.index);
    lastEngine.delete(spec.index);
    record.end = clock.now;
  };

  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < scenario.workload.length) await runOne(scenario.workload[next++]!);
  };
  let settled = 0;
  const workers = Array.from({ length: Math.min(scenario.concurrency, scenario.workload.length) }, () => worker().finally(() => settled++));
  await clock.run();
  // No event left: every worker must have finished by now, or the routing under test lost a request.
  await new Promise<void>((resolve) => setImmediate(resolve));
  if (settled < workers.length) throw new Error(`simulation stalled at ${clock.now.toFixed(1)} s with ${workers.length - settled} workers waiting`);
  await Promise.all(workers);
  router.close();

  const makespan = Math.max(0, ...records.map((r) => r.end));
  const latencies = records.map((r) => r.end - r.start).sort((a, b) => a - b);
  const sum = (f: (e: SimEngine) => number): number => engines.reduce((s, e) => s + f(e), 0);
  const prefill = sum((e) => e.model.prefillCostPerToken * (e.counters.promptTokens - e.counters.cachedTokens));
  return {
    policy,
    makespan,
    utilisation: sum((e) => e.counters.busySequenceSeconds) / (sum((e) => e.model.maxSequences) * makespan),
    utilisationSaturated: busyAtLastStart / (sum((e) => e.model.maxSequences) * lastStart),
    lastStart,
    latencyP50: percentile(latencies, 0.5),
    latencyP90: percentile(latencies, 0.9),
    latencyMax: latencies.at(-1) ?? Number.NaN,
    cacheHitRate: sum((e) => e.counters.cachedTokens) / sum((e) => e.counters.promptTokens),
    prefillShare: prefill / (prefill + sum((e) => e.counters.outputTokens)),
    moves,
    engines: engines.map((e) => ({
      id: e.id,
      maxSequences: e.model.maxSequences,
      ...e.counters,
      utilisation: e.counters.busySequenceSeconds / (e.model.maxSequences * makespan),
      trajectories: perEngine.get(e.id) ?? 0,
    })),
    trajectories: records,
  };
}
