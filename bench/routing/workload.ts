import { Rng } from './rng.js';

/** One trajectory of the simulated workload: what the agent loop will ask of the engines, turn by turn. */
export interface TrajectorySpec {
  readonly index: number;
  /** Tokens of the first prompt (system + task). */
  readonly promptTokens: number;
  /** Tokens the policy samples in each assistant turn; its length is the number of turns. */
  readonly outputTokens: readonly number[];
  /** Tokens the environment appends after each turn but the last (tool output, observation). */
  readonly observationTokens: readonly number[];
  /** Virtual seconds of tool execution after each turn but the last: the engine is not used meanwhile. */
  readonly toolSeconds: readonly number[];
}

/** The shape of a long-tailed multi-turn workload; medians and log-normal shapes (sigma) per quantity. */
export interface WorkloadOptions {
  trajectories: number;
  seed: number;
  turns: { median: number; sigma: number; max: number };
  promptTokens: { median: number; sigma: number; max: number };
  outputTokens: { median: number; sigma: number; max: number };
  observationTokens: { median: number; sigma: number; max: number };
  toolSeconds: { median: number; sigma: number; max: number };
}

/** Agentic RL-like defaults: a few turns typically, tens in the tail; replies of hundreds of tokens, thousands in the tail. */
export const DEFAULT_WORKLOAD: Omit<WorkloadOptions, 'trajectories' | 'seed'> = {
  turns: { median: 4, sigma: 0.9, max: 40 },
  promptTokens: { median: 1500, sigma: 0.6, max: 16_000 },
  outputTokens: { median: 350, sigma: 1.0, max: 8_192 },
  observationTokens: { median: 250, sigma: 1.0, max: 8_192 },
  toolSeconds: { median: 2, sigma: 1.0, max: 60 },
};

/** Draws the workload: the same options give the same trajectories, in submission order. */
export function makeWorkload(options: WorkloadOptions): TrajectorySpec[] {
  const rng = new Rng(options.seed);
  const int = (d: { median: number; sigma: number; max: number }): number => Math.round(rng.logNormal(d.median, d.sigma, 1, d.max));
  const out: TrajectorySpec[] = [];
  for (let index = 0; index < options.trajectories; index++) {
    const turns = int(options.turns);
    const outputTokens = Array.from({ length: turns }, () => int(options.outputTokens));
    const observationTokens = Array.from({ length: turns - 1 }, () => int(options.observationTokens));
    const toolSeconds = Array.from({ length: turns - 1 }, () => rng.logNormal(options.toolSeconds.median, options.toolSeconds.sigma, 0.05, options.toolSeconds.max));
    out.push({ index, promptTokens: int(options.promptTokens), outputTokens, observationTokens, toolSeconds });
  }
  return out;
}
