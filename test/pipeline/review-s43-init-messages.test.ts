import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import type { Environment } from '../../src/environments/types.js';
import type { ChatMessage } from '../../src/tokens/types.js';
import { collect } from '../support/harness.js';
import { CountingDriver } from '../support/probe-environment.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

// From the session-43 pipeline review. An environment whose init (its own code, after the task validated) answers no
// first message failed the sample INVALID_TASK, "messages: a conversation needs a first message" — the token ledger's
// refusal, taken for the task's: a field the TaskSpec does not have, and a status that tells the trainer its spec is
// bad (drop the task) when the environment broke (retry it, fix the plugin). The init stage now checks what init
// returned: ENVIRONMENT_ERROR saying so, before any engine request.

/** A TEST DOUBLE environment whose init answers what the instance's `answer` names. */
const hollowEnvironment: Environment<{ answer: string }> = {
  name: 'hollow',
  description: 'init answers no usable first message',
  instanceSchema: { type: 'object' },
  validate: (x) => ({ answer: String((x as { answer?: unknown }).answer) }),
  init: async ({ instance }) => {
    const answers: Record<string, unknown> = { empty: [], missing: undefined, 'not-a-message': [42], 'no-content': [{ role: 'user' }], good: [{ role: 'user', content: 'Say done.' }] };
    return { messages: answers[instance.answer] as ChatMessage[] };
  },
  tools: () => [],
  evaluate: async () => ({ reward: 1, details: {}, report: {} }),
};

let h: ServerHarness;
let driver: CountingDriver;
beforeAll(async () => {
  driver = new CountingDriver();
  h = await startServerHarness({ sandboxes: driver, registry: defaultRegistry().register(hollowEnvironment) });
});
afterAll(async () => h?.close());

async function run(answer: string): Promise<Trajectory> {
  const session = h.client.openSession();
  await session.submit({ taskId: `hollow-${answer}`, environment: 'hollow', numSamples: 1, instance: { answer } });
  session.close();
  return (await collect(session.trajectories()))[0]!;
}

describe("an environment's init that answers no usable first message", () => {
  it.each(['empty', 'missing', 'not-a-message', 'no-content'])('(%s) is ENVIRONMENT_ERROR naming init, not INVALID_TASK; no engine request is made', async (answer) => {
    const before = h.engine.stats().received;
    const t = await run(answer);
    expect(`${TrajectoryStatus[t.status]} ${t.error}`).toMatch(/^TRAJECTORY_STATUS_ENVIRONMENT_ERROR environment_error: init returned /);
    expect(h.engine.stats().received).toBe(before);
    expect(driver.live).toBe(0);
  });

  it('a usable one runs as usual', async () => {
    const t = await run('good');
    expect(TrajectoryStatus[t.status]).toBe('TRAJECTORY_STATUS_COMPLETED');
  });
});
