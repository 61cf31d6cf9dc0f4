import { afterEach, describe, expect, it } from 'vitest';
import { defaultRegistry } from '../../src/environments/registry.js';
import { promptIdsOf, promptIdsPending, setPromptTokenIds } from '../../src/pipeline/lazy-prompt.js';
import { encodeTrajectory } from '../../src/pipeline/trajectory-encode.js';
import { createLongContextEnvironment, LONG_CONTEXT_ENVIRONMENT, longContextPolicy } from '../../src/testing/long-context-environment.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { attachedVarints, attachVarints, packedVarints } from '../../src/tokens/packed-varints.js';
import { Trajectory, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

const harnesses: ServerHarness[] = [];
afterEach(async () => {
  for (const h of harnesses.splice(0)) await h.close();
});

/** A trajectory with some fields set and no prompt yet. */
function bare(): Trajectory {
  return Trajectory.fromPartial({ taskId: 't', sampleIndex: 3, responseTokenIds: [5, 6], responseMask: [1, 1], responseLogprobs: [-0.5, -0.25], numTurns: 1 });
}

const IDS = [151644, 872, 198, 0, 2147483647, 17, 151645];

function packed(): Int32Array {
  const ids = Int32Array.from(IDS);
  attachVarints(ids, packedVarints(ids)!);
  return ids;
}

describe('a trajectory prompt kept as its token thread\'s Int32Array', () => {
  it('encodes from the packed ids without making a number[], byte for byte as the generated encoder', () => {
    const t = bare();
    const ids = packed();
    setPromptTokenIds(t, ids);
    expect(promptIdsPending(t)).toBe(true);
    expect(promptIdsOf(t)).toBe(ids);
    const bytes = encodeTrajectory(t);
    expect(promptIdsPending(t)).toBe(true);
    expect(Buffer.from(bytes).equals(Buffer.from(Trajectory.encode({ ...bare(), promptTokenIds: IDS }).finish()))).toBe(true);
  });

  it('makes the number[] on the first read, once, with the varints attached; later it is a plain field', () => {
    const t = bare();
    setPromptTokenIds(t, packed());
    const first = t.promptTokenIds;
    expect(Array.isArray(first)).toBe(true);
    expect(first).toEqual(IDS);
    expect(promptIdsPending(t)).toBe(false);
    expect(t.promptTokenIds).toBe(first);
    expect(promptIdsOf(t)).toBe(first);
    expect(attachedVarints(first)).toEqual(packedVarints(IDS));
    expect(Object.getOwnPropertyDescriptor(t, 'promptTokenIds')).toMatchObject({ value: first, writable: true, enumerable: true });
    expect(Buffer.from(encodeTrajectory(t)).equals(Buffer.from(Trajectory.encode({ ...bare(), promptTokenIds: IDS }).finish()))).toBe(true);
  });

  it('reads as an ordinary field to spreads, JSON, structured clones and equality, and can be assigned', () => {
    const t = bare();
    setPromptTokenIds(t, packed());
    expect(JSON.parse(JSON.stringify(t)).promptTokenIds).toEqual(IDS);
    const other = bare();
    setPromptTokenIds(other, packed());
    expect(other).toEqual({ ...bare(), promptTokenIds: IDS });
    expect(structuredClone({ ...other }).promptTokenIds).toEqual(IDS);
    const assigned = bare();
    setPromptTokenIds(assigned, packed());
    assigned.promptTokenIds = [1, 2];
    expect(promptIdsPending(assigned)).toBe(false);
    expect(assigned.promptTokenIds).toEqual([1, 2]);
    expect(promptIdsOf(assigned)).toEqual([1, 2]);
  });

  it('keeps a number[] prompt as is (shared, not copied)', () => {
    const t = bare();
    const ids = [1, 2, 3];
    setPromptTokenIds(t, ids);
    expect(promptIdsPending(t)).toBe(false);
    expect(t.promptTokenIds).toBe(ids);
  });

  it('is what a server delivers for a long prompt tokenized on a token thread: sent exactly, never made on the way', async () => {
    const requests: number[][] = [];
    const h = await startServerHarness({
      registry: defaultRegistry().register(createLongContextEnvironment()),
      sandboxes: new NullSandboxDriver(),
      config: { tokenWorkers: { count: 1 } },
      engine: { policy: longContextPolicy, onCompletion: (c) => requests.push([...c.promptIds]) },
    });
    harnesses.push(h);
    const delivered: { trajectory: Trajectory; pending: boolean }[] = [];
    const sub = h.server.runtime.pipeline.events$.subscribe((e) => {
      if (e.type === 'finished') delivered.push({ trajectory: e.trajectory, pending: promptIdsPending(e.trajectory) });
    });
    const session = h.client.openSession();
    await session.submit({
      taskId: 'long',
      environment: LONG_CONTEXT_ENVIRONMENT,
      numSamples: 2,
      instance: { seed: 7, promptChars: 30_000, pages: 1, pageChars: 2_000 },
      sampling: { temperature: 1, seed: 7, maxTokensPerTurn: 64, maxTotalTokens: 65_536, stop: [] },
    });
    session.close();
    const received = await collect(session.trajectories());
    sub.unsubscribe();
    expect(received).toHaveLength(2);
    expect(delivered).toHaveLength(2);
    for (const wire of received) {
      expect(wire.status, wire.error).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
      expect(invariantViolations(wire)).toEqual([]);
      // Over 4,096 ids: the thread sent them packed, and the server's trajectory still held them so when delivered.
      expect(wire.promptTokenIds.length).toBeGreaterThan(4096);
      const local = delivered.find((d) => d.trajectory.sampleIndex === wire.sampleIndex)!;
      expect(local.pending).toBe(true);
      // Read in process, the field is the ids the client received, which every request of the trajectory began with.
      expect(local.trajectory.promptTokenIds).toEqual(wire.promptTokenIds);
    }
    const prompt = received[0]!.promptTokenIds;
    expect(requests.length).toBeGreaterThanOrEqual(4);
    for (const r of requests) expect(r.slice(0, prompt.length)).toEqual(prompt);
    expect(requests.some((r) => r.length === prompt.length)).toBe(true);
    const [a, b] = received;
    expect(a!.promptTokenIds).toEqual(b!.promptTokenIds);
  });
});
