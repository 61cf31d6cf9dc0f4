import { Stage, type StageEvent, type Trajectory, type TrajectorySummary } from '../../gen/ts/rollout/v1/rollout.js';
import { promptIdsOf } from '../pipeline/lazy-prompt.js';
import type { Sample } from '../pipeline/sample.js';
import type { StageName } from '../pipeline/task.js';

const STAGE: Record<StageName, Stage> = {
  queued: Stage.STAGE_QUEUED,
  init: Stage.STAGE_INIT,
  run: Stage.STAGE_RUN,
  eval: Stage.STAGE_EVAL,
  done: Stage.STAGE_DONE,
};

export function stageOf(name: StageName): Stage {
  return STAGE[name];
}

export function stageEventOf(sample: Sample, stage: StageName): StageEvent {
  return {
    taskId: sample.task.taskId,
    sampleIndex: sample.index,
    stage: STAGE[stage],
    groupId: sample.task.groupId,
    environment: sample.task.environment.name,
    unixMs: Date.now(),
  };
}

export function summaryOf(t: Trajectory): TrajectorySummary {
  return {
    taskId: t.taskId,
    sampleIndex: t.sampleIndex,
    groupId: t.groupId,
    environment: t.environment,
    status: t.status,
    finishReason: t.finishReason,
    reward: t.reward,
    numTurns: t.numTurns,
    promptTokens: promptIdsOf(t).length,
    responseTokens: t.responseTokenIds.length,
    timing: t.timing,
  };
}
