import { status, type ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutServiceService, Trajectory, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { getTrajectoryResponseBytes, trajectorySerializers } from '../../src/contract/response-encode.js';
import { wireSafe } from '../../src/pipeline/wire-safe.js';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { mathTask, startHarness, type Harness } from '../support/harness.js';

/**
 * GetTrajectory of a whole group answers with every trajectory in one message; a large group of long trajectories
 * can be more than the server may send. The trainer must still get every sample: the refusal says how big the answer
 * is, the limit, and how to ask for less (sample_index: one sample per call, each of which always fits).
 */
const LIMIT = 64 * 1024;
const GROUP = 64;

describe('GetTrajectory of a group larger than one message', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ maxMessageBytes: LIMIT });
  });
  afterAll(async () => h?.close());

  it('is RESOURCE_EXHAUSTED naming the size, the limit and sample_index; every sample is then fetched one by one', async () => {
    await h.client.submit(mathTask('big-group', GROUP, 11));
    const err = (await h.client.getTrajectory('big-group', { wait: true, deadlineMs: 120_000 }).catch((e: unknown) => e)) as ServiceError;
    expect(err.code).toBe(status.RESOURCE_EXHAUSTED);
    const size = /(\d+) bytes/.exec(err.details)?.[1];
    expect(Number(size)).toBeGreaterThan(LIMIT);
    expect(err.details).toContain(`${LIMIT}-byte`);
    expect(err.details).toContain('sample_index');

    // The way out works: each sample alone, and together they are the group (and more than one message).
    let total = 0;
    for (let i = 0; i < GROUP; i++) {
      const one = await h.client.getTrajectory('big-group', { sampleIndex: i });
      expect(one.pending).toBe(0);
      expect(one.trajectories.map((t) => t.sampleIndex)).toEqual([i]);
      expect(one.trajectories[0]!.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED);
      total += Trajectory.encode(one.trajectories[0]!).finish().length;
    }
    expect(total).toBeGreaterThan(LIMIT);
    expect(Number(size)).toBeGreaterThanOrEqual(total);
  }, 180_000);

  it("the TypeScript client's receive bound is its maxReceiveMessageBytes (a server configured above the default needs it raised)", async () => {
    await h.client.submit(mathTask('bounded-client', 1, 13));
    const one = await h.client.getTrajectory('bounded-client', { wait: true, deadlineMs: 60_000 });
    const bytes = Trajectory.encode(one.trajectories[0]!).finish().length;
    const small = new RolloutClient(h.server.address, { maxReceiveMessageBytes: bytes - 1 });
    try {
      const err = (await small.getTrajectory('bounded-client').catch((e: unknown) => e)) as ServiceError;
      expect(err.code).toBe(status.RESOURCE_EXHAUSTED);
    } finally {
      small.close();
    }
    const roomy = new RolloutClient(h.server.address, { maxReceiveMessageBytes: bytes + 64 });
    try {
      expect((await roomy.getTrajectory('bounded-client')).trajectories.map((t) => t.sampleIndex)).toEqual([0]);
    } finally {
      roomy.close();
    }
  }, 90_000);

  it('a group that fits is answered whole, as before', async () => {
    await h.client.submit(mathTask('small-group', 2, 12));
    const got = await h.client.getTrajectory('small-group', { wait: true, deadlineMs: 60_000 });
    expect(got.pending).toBe(0);
    expect(got.trajectories.map((t) => t.sampleIndex)).toEqual([0, 1]);
  }, 90_000);
});

describe('the size GetTrajectory is checked against', () => {
  it('is exactly the bytes the response serializer writes (what grpc-js compares with its send limit)', () => {
    const serialize = trajectorySerializers(RolloutServiceService, LIMIT).getTrajectory.responseSerialize;
    const trajectory = (i: number, tokens: number): Trajectory =>
      wireSafe(Trajectory.fromPartial({ taskId: 't', sampleIndex: i, responseTokenIds: Array.from({ length: tokens }, (_, k) => k), responseMask: Array(tokens).fill(1), responseLogprobs: Array(tokens).fill(-0.5) }), LIMIT);
    for (const response of [
      { trajectories: [], pending: 0 },
      { trajectories: [], pending: 300 },
      { trajectories: [trajectory(0, 3)], pending: 0 },
      { trajectories: [trajectory(0, 40), trajectory(1, 2000), trajectory(2, 0)], pending: 5 },
    ]) {
      expect(getTrajectoryResponseBytes(response)).toBe(serialize(response).length);
    }
  });
});
