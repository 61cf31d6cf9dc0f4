import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import type { TaskRejectedError } from '../../src/client/rollout-client.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { hermesToolCall, latestToolResponse, type FakePolicy } from '../../src/testing/scripted-policy.js';
import { echoEnvironment } from '../../examples/ts/echo-environment.js';
import { collect } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

/** Calls `shout` on the quoted word, then repeats what the tool said. */
const shouter: FakePolicy = (prompt) => {
  const observed = latestToolResponse(prompt);
  if (observed !== undefined) return `It is ${observed.trim()}.`;
  const word = /Shout "([^"]+)"/.exec(prompt)?.[1] ?? '';
  return hermesToolCall('shout', { text: word });
};

describe('an environment plugin (examples/ts/echo-environment.ts) registered on a real server', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({ engine: { policy: shouter }, registry: defaultRegistry().register(echoEnvironment) });
  });
  afterAll(async () => h?.close());

  it('is listed, validates its instance by field, runs its tool and scores the episode', async () => {
    const { environments } = await h.client.listEnvironments();
    expect(environments.find((e) => e.name === 'echo')?.tools).toEqual(['shout']);
    const session = h.client.openSession();
    const bad = await session.submit({ taskId: 'echo-bad', environment: 'echo', numSamples: 1, instance: { word: '' } }).catch((e: unknown) => e);
    expect((bad as TaskRejectedError).field).toBe('instance.word');
    await session.submit({ taskId: 'echo-1', environment: 'echo', numSamples: 2, instance: { word: 'hello' }, includeMessages: true });
    session.close();
    const trajectories = await collect(session.trajectories());
    expect(trajectories).toHaveLength(2);
    for (const t of trajectories) {
      expect(t.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
      expect(t.reward).toBe(1);
      expect(t.messages.find((m) => m.role === 'tool')?.content).toBe('HELLO');
    }
  });
});
