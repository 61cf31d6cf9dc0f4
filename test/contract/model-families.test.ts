import { afterAll, describe, expect, it } from 'vitest';
import { defaultRegistry } from '../../src/environments/registry.js';
import { MATH_QUESTION_PATTERN } from '../../src/testing/arithmetic.js';
import { CALC_ENVIRONMENT, createCalcEnvironment } from '../../src/testing/calc-environment.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import type { FakePolicy } from '../../src/testing/scripted-policy.js';
import { loadModelBundle } from '../../src/tokens/model-bundle.js';
import type { ToolCallParser } from '../../src/tools/types.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { familyDir, type Family } from '../tokens/families.js';

/** Where each family's template puts the latest tool result in the decoded prompt. */
const OBSERVATIONS: Partial<Record<Family, RegExp>> = {
  // Llama-3.1's short template has no tool role: results are user messages headed by the server.
  llama3_1: /Output of tool "calc":\n([^<]*)<\|eot_id\|>(?![\s\S]*Output of tool)/,
  deepseek_v3: /<｜tool▁output▁begin｜>([^<]*)<｜tool▁output▁end｜>(?![\s\S]*<｜tool▁output▁begin｜>)/,
};

/** The calc policy (calc-environment.ts) in the family's own call format and observation layout. */
function familyCalcPolicy(family: Family, parser: ToolCallParser): FakePolicy {
  return (prompt) => {
    const problem = MATH_QUESTION_PATTERN.exec(prompt)?.[1]?.trim();
    if (problem === undefined) return 'I cannot find a problem to solve.';
    const observation = OBSERVATIONS[family]!.exec(prompt)?.[1]?.trim();
    if (observation !== undefined && /^-?\d+$/.test(observation)) return `The answer is \\boxed{${observation}}.`;
    return parser.format([{ name: 'calc', arguments: { expression: problem } }]);
  };
}

const harnesses: ServerHarness[] = [];
afterAll(async () => {
  for (const h of harnesses) await h.close();
});

// The calc environment grades like math with an in-process tool: no sandbox process, so this file never shows up
// in the sandbox suites' host-wide scans for leftover cgroups.
describe.each(['llama3_1', 'deepseek_v3'] as const)('a server with model.dir pointing at the %s folder', (family) => {
  it('completes math tasks whose policy calls a tool in the family format', async () => {
    const dir = familyDir(family);
    const { tokenizer, parser } = await loadModelBundle({ dir });
    const h = await startServerHarness({
      config: { model: { name: 'fake-qwen3', dir } },
      engine: { tokenizer, policy: familyCalcPolicy(family, parser) },
      registry: defaultRegistry().register(createCalcEnvironment()),
      sandboxes: new NullSandboxDriver(),
    });
    harnesses.push(h);
    const session = h.client.openSession();
    await session.submit(mathTask(`${family}-math`, 3, 11, { environment: CALC_ENVIRONMENT }));
    session.close();
    const trajectories: Trajectory[] = await collect(session.trajectories());
    expect(trajectories).toHaveLength(3);
    for (const t of trajectories) {
      expect(TrajectoryStatus[t.status], t.error).toBe('TRAJECTORY_STATUS_COMPLETED');
      expect(t.reward).toBe(1);
      expect(invariantViolations(t)).toEqual([]);
      expect(t.turns).toHaveLength(3);
      expect(t.turns[1]).toMatchObject({ toolName: 'calc' });
      const text = tokenizer.decode([...t.promptTokenIds, ...t.responseTokenIds]);
      // The family's own structure, and nothing of Qwen's.
      expect(text).not.toContain('<|im_start|>');
      expect(text).toContain(family === 'llama3_1' ? '<|start_header_id|>assistant<|end_header_id|>' : '<｜Assistant｜>');
      expect(t.responseTokenIds.slice(t.turns[0]!.start, t.turns[0]!.end).at(-1)).toBe(tokenizer.stopTokenIds[0]);
    }
  });
});
