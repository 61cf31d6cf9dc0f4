import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Role, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { defaultImagePath } from '../../src/sandboxes/images/image-recipe.js';
import { createScriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { liveSandboxes, startServerHarness, type ServerHarness } from '../support/server-harness.js';

const image = defaultImagePath();

// The math environment end to end on the project's .sif image (built by scripts/setup.sh; in CI a missing image
// fails here rather than skipping): python and bash tools run in the image's own python3 and bash.
describe.runIf(existsSync(image) || process.env.CI)('math on the default .sif image through the long-lived bubblewrap sandbox', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({
      engine: { policy: createScriptedMathPolicy({ bashRate: 0.5, wrongAnswerRate: 0, malformedToolCallRate: 0 }) },
      config: { sandbox: { image } },
    });
  });
  afterAll(async () => h?.close());

  it('scores every sample, computing through python and bash inside the image, and leaves no sandbox behind', async () => {
    const session = h.client.openSession();
    await Promise.all([0, 1, 2, 3].map((g) => session.submit(mathTask(`sif-${g}`, 4, 900 + g, { includeMessages: true }))));
    session.close();
    const trajectories = await collect(session.trajectories());
    expect(trajectories).toHaveLength(16);
    const tools = new Set<string>();
    for (const t of trajectories) {
      expect(t.status, `${t.taskId}#${t.sampleIndex}: ${t.error}`).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
      expect(t.reward).toBe(1);
      expect(invariantViolations(t)).toEqual([]);
      for (const turn of t.turns) if (turn.role === Role.ROLE_TOOL) tools.add(turn.toolName);
      // The tool's output (the number) came back from the sandbox, not an error.
      expect(t.messages.find((m) => m.role === 'tool')?.content).toMatch(/^-?\d+$/);
    }
    expect(tools).toEqual(new Set(['python', 'bash']));
    expect(await liveSandboxes()).toEqual([]);
  });
});
