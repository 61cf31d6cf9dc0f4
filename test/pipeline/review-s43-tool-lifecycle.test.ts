import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import type { Environment } from '../../src/environments/types.js';
import type { Tool } from '../../src/tools/types.js';
import { collect } from '../support/harness.js';
import { CountingDriver } from '../support/probe-environment.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

// From the session-43 pipeline review. Tool instances are per sample and hold what `dispose()` releases (a connection,
// a helper process): the agent loop disposes each sample's tools when it ends. Admission's prompt check (an
// environment with `prompt`: the prompt is measured with the tools' schemas before the task is accepted) made one more
// set per task and never disposed it — one leaked set per submitted task for a whole training run.

let created = 0;
let disposed = 0;

/** A TEST DOUBLE tool set that counts its instances and their disposal. */
function countedTools(): Tool[] {
  created++;
  let gone = false;
  return [
    {
      name: 'lookup',
      description: 'Looks something up.',
      parameters: { type: 'object', properties: { q: { type: 'string' } } },
      run: async () => ({ output: 'nothing', outcome: 'ok' }),
      dispose: async () => {
        if (!gone) disposed++;
        gone = true;
      },
    },
  ];
}

/** A TEST DOUBLE environment whose first messages need no sandbox (`prompt`), so admission measures them. */
const pooledEnvironment: Environment<{ n: number }> = {
  name: 'pooled',
  description: 'per-sample tools with dispose',
  instanceSchema: { type: 'object' },
  validate: (x) => ({ n: Number((x as { n?: unknown }).n ?? 0) }),
  prompt: ({ n }) => [{ role: 'user', content: `Say done (${n}).` }],
  init: async ({ instance }) => ({ messages: [{ role: 'user', content: `Say done (${instance.n}).` }] }),
  tools: countedTools,
  evaluate: async () => ({ reward: 1, details: {}, report: {} }),
};

let h: ServerHarness;
beforeAll(async () => {
  h = await startServerHarness({ sandboxes: new CountingDriver(), registry: defaultRegistry().register(pooledEnvironment) });
});
afterAll(async () => h?.close());

describe("an environment's per-sample tools", () => {
  it('are disposed as many times as they are made: none left over from the admission check of the prompt', async () => {
    const session = h.client.openSession();
    for (let i = 0; i < 5; i++) await session.submit({ taskId: `pooled-${i}`, environment: 'pooled', numSamples: 2, instance: { n: i } });
    session.close();
    const got = await collect(session.trajectories());
    expect(got.map((t) => TrajectoryStatus[t.status])).toEqual(Array(10).fill('TRAJECTORY_STATUS_COMPLETED'));
    // Ten samples' tools, disposed by their agent loops; anything made for the admission check is disposed too.
    expect(created).toBeGreaterThanOrEqual(10);
    await eventually(() => disposed === created, `every tool set disposed (${disposed} of ${created})`, 5_000);
  });
});
