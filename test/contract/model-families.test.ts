import { afterAll, describe, expect, it } from 'vitest';
import { createScriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { loadModelBundle } from '../../src/tokens/model-bundle.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { familyDir, type Family } from '../tokens/families.js';

/** Where each family's template puts the latest tool result in the decoded prompt. */
const OBSERVATIONS: Partial<Record<Family, RegExp>> = {
  // Llama-3.1's short template has no tool role: results are user messages headed by the server.
  llama3_1: /Output of tool "python":\n([^<]*)<\|eot_id\|>(?![\s\S]*Output of tool)/,
  deepseek_v3: /<｜tool▁output▁begin｜>([^<]*)<｜tool▁output▁end｜>(?![\s\S]*<｜tool▁output▁begin｜>)/,
};

const harnesses: ServerHarness[] = [];
afterAll(async () => {
  for (const h of harnesses) await h.close();
});

describe.each(['llama3_1', 'deepseek_v3'] as const)('a server with model.dir pointing at the %s folder', (family) => {
  it('completes math tasks whose policy calls the python tool in the family format', async () => {
    const dir = familyDir(family);
    const { tokenizer, parser } = await loadModelBundle({ dir });
    const policy = createScriptedMathPolicy({
      wrongAnswerRate: 0,
      malformedToolCallRate: 0,
      formatCall: (name, args) => parser.format([{ name, arguments: args }]),
      observation: (prompt) => OBSERVATIONS[family]!.exec(prompt)?.[1]?.trim(),
    });
    const h = await startServerHarness({ config: { model: { name: 'fake-qwen3', dir } }, engine: { tokenizer, policy } });
    harnesses.push(h);
    const session = h.client.openSession();
    await session.submit(mathTask(`${family}-math`, 3, 11));
    session.close();
    const trajectories: Trajectory[] = await collect(session.trajectories());
    expect(trajectories).toHaveLength(3);
    for (const t of trajectories) {
      expect(TrajectoryStatus[t.status], t.error).toBe('TRAJECTORY_STATUS_COMPLETED');
      expect(t.reward).toBe(1);
      expect(invariantViolations(t)).toEqual([]);
      expect(t.turns).toHaveLength(3);
      expect(t.turns[1]).toMatchObject({ toolName: 'python' });
      const text = tokenizer.decode([...t.promptTokenIds, ...t.responseTokenIds]);
      // The family's own structure, and nothing of Qwen's.
      expect(text).not.toContain('<|im_start|>');
      expect(text).toContain(family === 'llama3_1' ? '<|start_header_id|>assistant<|end_header_id|>' : '<｜Assistant｜>');
      expect(t.responseTokenIds.slice(t.turns[0]!.start, t.turns[0]!.end).at(-1)).toBe(tokenizer.stopTokenIds[0]);
    }
  });
});
