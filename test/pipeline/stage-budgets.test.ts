import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { parseConfig } from '../../src/config.js';
import { defineEnvironment } from '../../src/environments/define.js';
import { EnvironmentRegistry } from '../../src/environments/registry.js';
import { createSweEnvironment, EVAL_OVERHEAD_MS } from '../../src/environments/swe/swe-environment.js';
import { validateTask } from '../../src/pipeline/validate-task.js';
import { TaskSpec } from '../../gen/ts/rollout/v1/rollout.js';

// Which stage budgets a task runs with: its own limits, else its environment's defaults, else the server's.
const config = parseConfig({ init: { timeoutMs: 11_000 }, run: { timeoutMs: 22_000 }, eval: { timeoutMs: 33_000 }, defaults: { totalTimeoutMs: 50_000 } });
const plain = defineEnvironment({ name: 'plain', description: 'no budgets', instance: z.object({}), prompt: () => [{ role: 'user', content: 'hi' }], evaluate: () => Promise.resolve({ reward: 1, details: {}, report: {} }) });
const grader = defineEnvironment({
  name: 'grader',
  description: 'a long grading step',
  instance: z.object({}),
  stageTimeouts: { evalMs: 400_000 },
  prompt: () => [{ role: 'user', content: 'hi' }],
  evaluate: () => Promise.resolve({ reward: 1, details: {}, report: {} }),
});
const registry = new EnvironmentRegistry().register(plain).register(grader).register(createSweEnvironment({ testTimeoutMs: 90_000 }));
const spec = (environment: string, limits: Partial<NonNullable<TaskSpec['limits']>> = {}): TaskSpec =>
  TaskSpec.fromPartial({ taskId: `t-${environment}`, numSamples: 1, environment, instance: {}, limits });

describe('stage budgets', () => {
  it('come from the server config when neither the task nor the environment says', () => {
    const { limits } = validateTask(spec('plain'), registry, config);
    expect(limits).toMatchObject({ initTimeoutMs: 11_000, runTimeoutMs: 22_000, evalTimeoutMs: 33_000, totalTimeoutMs: 50_000 });
  });

  it("take the environment's default over the server's, and the total grows to cover init + run + eval", () => {
    const { limits } = validateTask(spec('grader'), registry, config);
    expect(limits).toMatchObject({ initTimeoutMs: 11_000, runTimeoutMs: 22_000, evalTimeoutMs: 400_000, totalTimeoutMs: 433_000 });
  });

  it("take the task's own limits over both", () => {
    const { limits } = validateTask(spec('grader', { evalTimeoutMs: 5_000, totalTimeoutMs: 7_000 }), registry, config);
    expect(limits).toMatchObject({ evalTimeoutMs: 5_000, totalTimeoutMs: 7_000 });
  });

  it('give swe an eval budget longer than its test budget, so hanging tests are reward 0 and not TIMEOUT', () => {
    const swe = registry.get('swe');
    expect(swe?.stageTimeouts?.evalMs).toBe(90_000 + EVAL_OVERHEAD_MS);
  });
});
