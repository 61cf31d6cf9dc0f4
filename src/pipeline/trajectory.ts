import type { LogprobsMode as EngineLogprobsMode } from '../backends/types.js';
import { describeError, type RolloutError } from '../errors.js';
import { LogprobsMode } from '../../gen/ts/rollout/v1/backend.js';
import { Role, ToolOutcome, Trajectory, TrajectoryStatus, type Turn } from '../../gen/ts/rollout/v1/rollout.js';
import type { LedgerSnapshot, LedgerTurn } from '../tokens/ledger.js';
import { finishReasonForError, statusForError } from './outcome.js';
import type { Sample } from './sample.js';
import { exceedsStaleness } from './staleness.js';
import { setPromptTokenIds } from './lazy-prompt.js';

/** The trajectory of a sample that went through eval: COMPLETED, or TRUNCATED when a budget ended it. */
export function buildTrajectory(sample: Sample): Trajectory {
  const run = sample.run;
  const evaluation = sample.evaluation;
  const trajectory = base(sample);
  if (!run || !evaluation) {
    // Unreachable by construction (eval runs after run); reported as an environment error rather than reward 0.
    return { ...trajectory, status: TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR, finishReason: 'error', error: 'sample finished without run or eval result' };
  }
  // One object, the tokens set last: a spread of it would make a lazily kept prompt's number[] (lazy-prompt.ts).
  return withTokens(
    {
      ...trajectory,
      status: run.truncated ? TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED : TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED,
      finishReason: run.outcome.finishReason,
      reward: evaluation.reward,
      rewardDetails: { ...evaluation.details },
      evalReport: evaluation.report,
      numTurns: run.numTurns,
      // Past max_staleness: FLAG, or RESTART with no restart left. The reward is computed all the same.
      stale: exceedsStaleness(sample.task.limits, run.tokens),
    },
    run.tokens,
    sample.task.includeMessages,
  );
}

/**
 * The trajectory of a sample that failed, timed out or was cancelled; partial tokens are kept when the run got that
 * far. `error` says why, cause chain included and bounded (see describeError).
 */
export function buildFailedTrajectory(sample: Sample, err: RolloutError): Trajectory {
  const trajectory = {
    ...base(sample),
    status: statusForError(err),
    finishReason: finishReasonForError(err),
    error: describeError(err),
  };
  // The tokens are kept for debugging when they can be; a run result too broken to map is left out, so building
  // the failure can never throw in turn.
  try {
    if (sample.run) return withTokens({ ...trajectory, numTurns: sample.run.numTurns }, sample.run.tokens, sample.task.includeMessages);
    const partial = partialTokens(sample);
    if (partial) return withTokens({ ...trajectory, numTurns: partial.turns.filter((t) => t.role === 'assistant' && t.continuesTurn !== true).length }, partial, sample.task.includeMessages);
  } catch {
    return { ...trajectory, error: `${trajectory.error} (its tokens could not be read)` };
  }
  return trajectory;
}

/** The tokens a sample got to before its run failed (for debugging; trainers filter the status out). */
function partialTokens(sample: Sample): LedgerSnapshot | undefined {
  try {
    return sample.ledger?.snapshot();
  } catch {
    return undefined;
  }
}

function base(sample: Sample): Trajectory {
  const task = sample.task;
  return Trajectory.fromPartial({
    taskId: task.taskId,
    sampleIndex: sample.index,
    groupId: task.groupId,
    environment: task.environment.name,
    metadata: { ...task.metadata },
    stalenessRestarts: sample.stalenessRestarts,
  });
}

/** Sets the token fields on `trajectory` (a fresh object, returned): the prompt's ids shared, or kept lazily. */
function withTokens(trajectory: Trajectory, tokens: LedgerSnapshot, includeMessages: boolean): Trajectory {
  setPromptTokenIds(trajectory, tokens.promptIds);
  trajectory.responseTokenIds = tokens.responseIds;
  trajectory.responseMask = tokens.mask;
  trajectory.responseLogprobs = tokens.logprobs;
  trajectory.turns = tokens.turns.map(toTurn);
  trajectory.messages = includeMessages ? tokens.messages.map((m) => ({ role: m.role, content: m.content, name: m.name ?? '' })) : [];
  trajectory.policyVersionMin = tokens.policyVersionMin;
  trajectory.policyVersionMax = tokens.policyVersionMax;
  trajectory.logprobsMode = logprobsModeToProto(trajectoryLogprobsMode(tokens.turns));
  return trajectory;
}

/**
 * The logprobs mode of a whole trajectory, from its sampled (assistant) turns: `mixed` when engines of both modes
 * sampled it (its ratios cannot be computed one way); otherwise unknown (undefined) when any turn's engine did not
 * say or nothing was sampled — one unknown turn is enough to make the whole unverifiable; otherwise the common mode.
 */
export function trajectoryLogprobsMode(turns: readonly LedgerTurn[]): EngineLogprobsMode | 'mixed' | undefined {
  const sampled = turns.filter((t) => t.role === 'assistant');
  const modes = new Set(sampled.map((t) => t.logprobsMode));
  if (modes.has('raw') && modes.has('processed')) return 'mixed';
  if (sampled.length === 0 || modes.has(undefined) || modes.size !== 1) return undefined;
  return sampled[0]!.logprobsMode;
}

const ROLE: Record<LedgerTurn['role'], Role> = {
  assistant: Role.ROLE_ASSISTANT,
  tool: Role.ROLE_TOOL,
  user: Role.ROLE_USER,
};

const OUTCOME: Record<NonNullable<LedgerTurn['toolOutcome']>, ToolOutcome> = {
  ok: ToolOutcome.TOOL_OUTCOME_OK,
  error: ToolOutcome.TOOL_OUTCOME_ERROR,
  malformed: ToolOutcome.TOOL_OUTCOME_MALFORMED,
  finish: ToolOutcome.TOOL_OUTCOME_FINISH,
};

function toTurn(turn: LedgerTurn): Turn {
  return {
    role: ROLE[turn.role],
    start: turn.start,
    end: turn.end,
    backend: turn.backend ?? '',
    policyVersion: turn.policyVersion ?? 0,
    finishReason: turn.finishReason ?? '',
    toolName: turn.toolName ?? '',
    toolOutcome: turn.toolOutcome ? OUTCOME[turn.toolOutcome] : ToolOutcome.TOOL_OUTCOME_UNSPECIFIED,
    continuesTurn: turn.continuesTurn ?? false,
    policyVersionStart: turn.policyVersionStart ?? turn.policyVersion ?? 0,
  };
}

/** The contract's enum value of a logprobs mode (UNSPECIFIED when unknown). */
export function logprobsModeToProto(mode: EngineLogprobsMode | 'mixed' | undefined): LogprobsMode {
  switch (mode) {
    case 'raw':
      return LogprobsMode.LOGPROBS_MODE_RAW;
    case 'processed':
      return LogprobsMode.LOGPROBS_MODE_PROCESSED;
    case 'mixed':
      return LogprobsMode.LOGPROBS_MODE_MIXED;
    case undefined:
      return LogprobsMode.LOGPROBS_MODE_UNSPECIFIED;
  }
}
