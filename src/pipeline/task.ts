import type { Environment } from '../environments/types.js';
import type { Timing, Trajectory } from '../../gen/ts/rollout/v1/rollout.js';

/** Sampling settings after defaults are applied. */
export interface ResolvedSampling {
  temperature?: number;
  topP?: number;
  topK?: number;
  seed?: number;
  maxTokensPerTurn: number;
  maxTotalTokens: number;
  stop: string[];
}

/** What happens to a trajectory past its max_staleness (the contract's StalenessAction; unset = flag). */
export type StalenessAction = 'flag' | 'restart';

export interface ResolvedLimits {
  maxTurns: number;
  initTimeoutMs: number;
  runTimeoutMs: number;
  evalTimeoutMs: number;
  totalTimeoutMs: number;
  /** Bound on policy_version_max − policy_version_min of a trajectory; undefined = unbounded. */
  maxStaleness?: number;
  /** Undefined = flag. */
  stalenessAction?: StalenessAction;
}

/** A validated task: everything the pipeline needs, defaults applied. */
export interface ResolvedTask {
  taskId: string;
  groupId: string;
  numSamples: number;
  environment: Environment;
  instance: unknown;
  sampling: ResolvedSampling;
  limits: ResolvedLimits;
  metadata: Record<string, string>;
  includeMessages: boolean;
  /** Canonical form of the spec, to tell a true retry from a conflicting reuse of the task_id. */
  fingerprint: string;
}

export type StageName = 'queued' | 'init' | 'run' | 'eval' | 'done';

/** Milliseconds per phase (the contract's Timing); filled in as the sample moves through the pipeline. */
export type SampleTiming = Timing;

/** Sink for finished trajectories; set by whoever submitted the task (a session, or the unary API). */
export type TrajectorySink = (trajectory: Trajectory) => void;
