import { Client, credentials, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskRejectedError } from '../../src/client/rollout-client.js';
import {
  RolloutRequest,
  RolloutServiceClient,
  TaskSpec,
  TrajectoryStatus,
  WatchResponse,
  type Trajectory,
} from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask, startHarness, type Harness } from '../support/harness.js';
import { rawRollout } from '../support/raw-rollout.js';

const OK = new Set([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED]);

/** An instance nested `depth` objects deep: { x: { x: ... { a: 1 } } }. */
function nested(depth: number): Record<string, unknown> {
  let value: Record<string, unknown> = { a: 1 };
  for (let i = 1; i < depth; i++) value = { x: value };
  return value;
}

const taskBytes = (spec: Partial<TaskSpec>): Uint8Array => RolloutRequest.encode({ kind: { $case: 'task', value: TaskSpec.fromPartial(spec) } }).finish();

describe('nothing a client sends kills its stream', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness();
  });
  afterAll(async () => h?.close());

  it('rejects a seed above 2^53 and an instance nested 33 deep by field, while the stream and its other tasks go on', async () => {
    const session = h.client.openSession();
    const before = session.submit(mathTask('hostile-before', 2, 3));
    const rejection = async (spec: Parameters<typeof session.submit>[0]): Promise<TaskRejectedError> => {
      const err = await session.submit(spec).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(TaskRejectedError);
      return err as TaskRejectedError;
    };
    const seed = await rejection({ ...mathTask('hostile-seed', 1, 4), sampling: { seed: 2 ** 60, maxTokensPerTurn: 0, maxTotalTokens: 0, stop: [] } });
    expect(seed.field).toBe('sampling.seed');
    expect(seed.taskId).toBe('hostile-seed');
    expect(seed.reason).toContain('1152921504606846976');
    const negative = await rejection({ ...mathTask('hostile-seed-neg', 1, 4), sampling: { seed: -(2 ** 62), maxTokensPerTurn: 0, maxTotalTokens: 0, stop: [] } });
    expect(negative.field).toBe('sampling.seed');
    const deep = await rejection({ ...mathTask('hostile-deep', 1, 5), instance: { problem: 'What is 1 + 1?', answer: '2', extra: nested(33) } });
    expect(deep.field).toBe('instance');
    expect(deep.taskId).toBe('hostile-deep');
    // The largest exact seed is honoured (and its per-sample seeds stay exact).
    const after = session.submit({ ...mathTask('hostile-after', 2, 6), sampling: { seed: Number.MAX_SAFE_INTEGER, temperature: 1, maxTokensPerTurn: 256, maxTotalTokens: 4096, stop: [] } });
    await Promise.all([before, after]);
    session.close();
    const trajectories = await collect(session.trajectories());
    expect(trajectories.map((t) => `${t.taskId}#${t.sampleIndex}`).sort()).toEqual(['hostile-after#0', 'hostile-after#1', 'hostile-before#0', 'hostile-before#1']);
    for (const t of trajectories) {
      expect(OK.has(t.status), `${t.taskId}: ${TrajectoryStatus[t.status]} ${t.error}`).toBe(true);
      expect(invariantViolations(t)).toEqual([]);
    }
  });

  it('answers Submit with INVALID_ARGUMENT naming the field, not INTERNAL', async () => {
    const client = new RolloutServiceClient(h.server.address, credentials.createInsecure());
    try {
      const submit = (spec: TaskSpec): Promise<ServiceError> =>
        new Promise((resolve, reject) => client.submit({ task: spec }, (err) => (err ? resolve(err) : reject(new Error('accepted')))));
      for (const [spec, field] of [
        [TaskSpec.fromPartial({ ...mathTask('unary-seed', 1, 1), sampling: { seed: 2 ** 60 } }), 'task.sampling.seed'],
        [TaskSpec.fromPartial({ ...mathTask('unary-deep', 1, 1), instance: nested(40) }), 'task.instance'],
      ] as const) {
        const err = await submit(spec);
        expect(err.code).toBe(status.INVALID_ARGUMENT);
        expect(err.details).toContain(field);
        expect(err.metadata.get('rollout-field')).toEqual([field]);
      }
    } finally {
      client.close();
    }
  });

  it('answers a Watch request that does not decode with INVALID_ARGUMENT', async () => {
    const client = new Client(h.server.address, credentials.createInsecure());
    try {
      const call = client.makeServerStreamRequest(
        '/rollout.v1.RolloutService/Watch',
        (bytes: Uint8Array) => Buffer.from(bytes),
        (bytes: Buffer) => WatchResponse.decode(bytes),
        new Uint8Array([0x0a, 0x40, 0x41]),
        new Metadata(),
      );
      const code = await new Promise<number>((resolve) => {
        call.on('error', (e: ServiceError) => resolve(e.code));
        call.on('status', (s: { code: number }) => resolve(s.code));
      });
      expect(code).toBe(status.INVALID_ARGUMENT);
    } finally {
      client.close();
    }
  });

  it('survives garbage, truncated messages and a second open on one stream, then delivers the next task', async () => {
    const raw = rawRollout(h.server.address);
    try {
      raw.send(RolloutRequest.encode({ kind: { $case: 'open', value: { sessionId: '', resume: false, stageEvents: false } } }).finish());
      raw.send(new Uint8Array([0xff, 0xff, 0xff]));
      const good = taskBytes({ ...mathTask('raw-good', 1, 11), sampling: { temperature: 1, seed: 11, maxTokensPerTurn: 256, maxTotalTokens: 4096, stop: [] } });
      raw.send(good.subarray(0, good.length - 3));
      raw.send(RolloutRequest.encode({ kind: { $case: 'open', value: { sessionId: 'again', resume: false, stageEvents: false } } }).finish());
      raw.send(good);
      raw.end();
      const responses = await raw.responses;
      expect(await raw.status).toBe(status.OK);
      const rejected = responses.flatMap((r) => (r.kind?.$case === 'rejected' ? [r.kind.value] : []));
      expect(rejected).toHaveLength(3);
      expect(rejected[0]!.reason).toContain('not a valid rollout.v1.RolloutRequest');
      expect(rejected[1]!.taskId === '' || rejected[1]!.taskId === 'raw-good').toBe(true);
      expect(rejected[2]!.field).toBe('open');
      const trajectories = responses.flatMap((r) => (r.kind?.$case === 'trajectory' ? [r.kind.value] : []));
      expect(trajectories.map((t) => t.taskId)).toEqual(['raw-good']);
      expect(OK.has(trajectories[0]!.status)).toBe(true);
    } finally {
      raw.client.close();
    }
  });

  it('property: any mutation of a valid request gets its answer and never ends the stream', async () => {
    const valid = taskBytes({ ...mathTask('fuzz-base', 1, 21), sampling: { temperature: 1, seed: 21, maxTokensPerTurn: 64, maxTotalTokens: 2048, stop: [] }, instance: { problem: 'What is 2 + 3?', answer: '5', deep: nested(30) } });
    const mutation = fc.oneof(
      fc.record({ at: fc.nat(valid.length - 1), byte: fc.integer({ min: 0, max: 255 }) }).map(({ at, byte }) => {
        const copy = Uint8Array.from(valid);
        copy[at] = byte;
        return copy;
      }),
      fc.nat(valid.length - 1).map((n) => valid.subarray(0, n)),
      fc.uint8Array({ minLength: 1, maxLength: 64 }),
    );
    // A fixed seed: the same 150 messages every run (a flaky fuzz test would be a bug of its own).
    const messages = fc.sample(mutation, { seed: 20261124, numRuns: 150 });
    let expectedAnswers = 0;
    const decodedTaskIds = new Set<string>();
    for (const bytes of messages) {
      try {
        const request = RolloutRequest.decode(bytes);
        if (request.kind?.$case === 'task') {
          expectedAnswers++;
          decodedTaskIds.add(request.kind.value.taskId);
        } else if (request.kind?.$case === 'open') expectedAnswers++;
      } catch {
        expectedAnswers++;
      }
    }
    const raw = rawRollout(h.server.address);
    try {
      for (const bytes of messages) raw.send(bytes);
      raw.send(taskBytes({ ...mathTask('fuzz-final', 1, 22) }));
      raw.end();
      const responses = await raw.responses;
      expect(await raw.status).toBe(status.OK);
      const answers = responses.filter((r) => r.kind?.$case === 'accepted' || r.kind?.$case === 'rejected');
      // One answer per message that decoded to a task or an open, or did not decode; plus the final task's.
      expect(answers).toHaveLength(expectedAnswers + 1);
      const trajectories: Trajectory[] = responses.flatMap((r) => (r.kind?.$case === 'trajectory' ? [r.kind.value] : []));
      expect(trajectories.some((t) => t.taskId === 'fuzz-final' && OK.has(t.status))).toBe(true);
      for (const t of trajectories) expect(invariantViolations(t)).toEqual([]);
    } finally {
      raw.client.close();
    }
  });
});
