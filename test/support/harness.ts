import type { ServerConfigInput } from '../../src/config.js';
import type { FakeVllmOptions } from '../../src/testing/fake-vllm.js';
import { makeMathProblem } from '../../src/testing/arithmetic.js';
import { startServerHarness, type ServerHarness } from './server-harness.js';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { Role, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';

export type Harness = ServerHarness;

/** A real server on 127.0.0.1:0 with bubblewrap sandboxes, routed to the fake vLLM engine (test double). */
export function startHarness(config: ServerConfigInput = {}, engineOptions: Partial<FakeVllmOptions> = {}): Promise<Harness> {
  return startServerHarness({ config, engine: engineOptions });
}

/** A math task on a generated arithmetic problem. */
export function mathTask(taskId: string, numSamples: number, seed: number, extra: Partial<TaskInput> = {}): TaskInput {
  const problem = makeMathProblem(seed);
  return {
    taskId,
    environment: 'math',
    numSamples,
    instance: { problem: problem.question, answer: String(problem.answer) },
    sampling: { temperature: 1, seed, maxTokensPerTurn: 256, maxTotalTokens: 4096, stop: [] },
    ...extra,
  };
}

/** The invariants every trajectory must keep; returns the violations (empty when fine). */
export function invariantViolations(t: Trajectory): string[] {
  const out: string[] = [];
  const n = t.responseTokenIds.length;
  if (t.responseMask.length !== n || t.responseLogprobs.length !== n) out.push(`lengths ${n}/${t.responseMask.length}/${t.responseLogprobs.length}`);
  t.responseMask.forEach((m, i) => {
    if (m === 0 && t.responseLogprobs[i] !== 0) out.push(`logprob at masked ${i}`);
  });
  let at = 0;
  for (const turn of t.turns) {
    if (turn.start !== at) out.push(`turn starts at ${turn.start}, expected ${at}`);
    const want = turn.role === Role.ROLE_ASSISTANT ? 1 : 0;
    for (let i = turn.start; i < turn.end; i++) if (t.responseMask[i] !== want) out.push(`mask ${i} in ${Role[turn.role]} turn`);
    at = turn.end;
  }
  if (at !== n) out.push(`turns end at ${at}, response has ${n}`);
  return out;
}

export async function collect<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of iterable) out.push(x);
  return out;
}
