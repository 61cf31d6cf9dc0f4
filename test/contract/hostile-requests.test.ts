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
import { encodeFields, len, utf8, varint } from '../support/wire-bytes.js';

const OK = new Set([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED]);

/** An instance nested `depth` objects deep: { x: { x: ... { a: 1 } } }. */
function nested(depth: number): Record<string, unknown> {
  let value: Record<string, unknown> = { a: 1 };
  for (let i = 1; i < depth; i++) value = { x: value };
  return value;
}

const taskBytes = (spec: Partial<TaskSpec>): Uint8Array => RolloutRequest.encode({ kind: { $case: 'task', value: TaskSpec.fromPartial(spec) } }).finish();

/** `bytes` with the (ASCII) `mark` replaced by a same-length run ending in 0xff: a string that is no longer UTF-8. */
function breakUtf8(bytes: Uint8Array, mark: string): Uint8Array {
  const at = Buffer.from(bytes).indexOf(mark);
  if (at < 0) throw new Error(`no ${mark} in the bytes`);
  const out = Uint8Array.from(bytes);
  out[at + mark.length - 1] = 0xff;
  return out;
}

/** Raw bytes to any unary method: its status code and `rollout-field` trailer. */
function rawUnary(client: Client, path: string, bytes: Uint8Array): Promise<{ code: number; field: string; details: string }> {
  return new Promise((resolve) => {
    client.makeUnaryRequest(
      path,
      (b: Uint8Array) => Buffer.from(b),
      (b: Buffer) => b,
      bytes,
      new Metadata(),
      (err: ServiceError | null) => resolve(err ? { code: err.code, field: String(err.metadata.get('rollout-field')[0] ?? ''), details: err.details } : { code: status.OK, field: '', details: '' }),
    );
  });
}

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
        // Validation names the field the same way (request-relative), in the trailer and the message.
        [TaskSpec.fromPartial({ ...mathTask('unary-n', 1, 1), numSamples: 0 }), 'task.num_samples'],
        [TaskSpec.fromPartial({ ...mathTask('unary-answer', 1, 1), instance: { problem: 'x' } }), 'task.instance.answer'],
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

  it('answers a request with no kind (a kind sent with the wrong wire type, an unknown kind, nothing) naming the field', async () => {
    const raw = rawRollout(h.server.address);
    try {
      raw.send(RolloutRequest.encode({ kind: { $case: 'open', value: { sessionId: '', resume: false, stageEvents: false } } }).finish());
      raw.send(encodeFields([varint(2, 5n)]));
      raw.send(encodeFields([len(9, utf8('a kind from a newer contract'))]));
      raw.send(new Uint8Array());
      raw.send(taskBytes({ ...mathTask('kind-after', 1, 12) }));
      raw.end();
      const responses = await raw.responses;
      expect(await raw.status).toBe(status.OK);
      const answers = responses.flatMap((r) => (r.kind?.$case === 'accepted' || r.kind?.$case === 'rejected' ? [r.kind] : []));
      expect(answers.map((a) => (a.$case === 'rejected' ? `rejected ${a.value.field}` : `accepted ${a.value.taskId}`))).toEqual(['rejected task', 'rejected kind', 'rejected kind', 'accepted kind-after']);
      const rejected = answers.flatMap((a) => (a.$case === 'rejected' ? [a.value] : []));
      expect(rejected[0]!.reason).toContain('wrong wire type');
      expect(rejected[1]!.reason).toContain('field 9');
      for (const r of rejected.slice(1)) expect(r.reason).toContain('open, task, cancel, ack');
      expect(responses.some((r) => r.kind?.$case === 'trajectory' && r.kind.value.taskId === 'kind-after')).toBe(true);
    } finally {
      raw.client.close();
    }
  });

  it('refuses strings that are not UTF-8 by field on every RPC, and accepts a U+FFFD sent as UTF-8', async () => {
    const badId = breakUtf8(taskBytes({ ...mathTask('utf8-idMARK', 1, 13) }), 'MARK');
    const badAnswer = breakUtf8(taskBytes({ ...mathTask('utf8-answer', 1, 14), instance: { problem: 'What is 1 + 1?', answer: '2MARK' } }), 'MARK');
    const badMeta = breakUtf8(taskBytes({ ...mathTask('utf8-meta', 1, 15), metadata: { run: 'vMARK' } }), 'MARK');
    const badKey = breakUtf8(taskBytes({ ...mathTask('utf8-key', 1, 16), metadata: { kMARK: 'v' } }), 'MARK');
    const legit = taskBytes({ ...mathTask('utf8-legit-\uFFFD', 1, 17), metadata: { note: 'replacement \uFFFD char' } });
    const raw = rawRollout(h.server.address);
    try {
      for (const bytes of [badId, badAnswer, badMeta, badKey, legit]) raw.send(bytes);
      raw.end();
      const responses = await raw.responses;
      expect(await raw.status).toBe(status.OK);
      const answers = responses.flatMap((r) => (r.kind?.$case === 'accepted' || r.kind?.$case === 'rejected' ? [r.kind] : []));
      expect(answers.map((a) => `${a.$case} ${a.value.taskId} ${a.$case === 'rejected' ? a.value.field : ''}`)).toEqual([
        // A task_id that is not UTF-8 has no honest spelling: the rejection carries none.
        'rejected  task_id',
        'rejected utf8-answer instance.answer',
        'rejected utf8-meta metadata.run',
        'rejected utf8-key metadata',
        'accepted utf8-legit-\uFFFD ',
      ]);
      for (const a of answers) if (a.$case === 'rejected') expect(a.value.reason).toContain('UTF-8');
      const legitTrajectory = responses.flatMap((r) => (r.kind?.$case === 'trajectory' ? [r.kind.value] : []));
      expect(legitTrajectory.map((t) => t.taskId)).toEqual(['utf8-legit-\uFFFD']);
    } finally {
      raw.client.close();
    }
    // The unary RPCs: INVALID_ARGUMENT naming the field from the request.
    const client = new Client(h.server.address, credentials.createInsecure());
    const asSubmit = (bytes: Uint8Array): Uint8Array => Uint8Array.from([0x0a, ...bytes.subarray(1)]);
    const bad = Uint8Array.of(0x61, 0xff);
    try {
      for (const [path, bytes, field] of [
        ['/rollout.v1.RolloutService/Submit', asSubmit(badId), 'task.task_id'],
        ['/rollout.v1.RolloutService/Submit', asSubmit(badAnswer), 'task.instance.answer'],
        ['/rollout.v1.RolloutService/GetTrajectory', encodeFields([len(1, bad)]), 'task_id'],
        ['/rollout.v1.RolloutService/Cancel', encodeFields([len(1, bad)]), 'task_id'],
        ['/rollout.v1.BackendService/AddBackend', encodeFields([len(1, Uint8Array.of(...utf8('http://x/'), 0xc0, 0xaf))]), 'url'],
        ['/rollout.v1.BackendService/RemoveBackend', encodeFields([len(1, bad)]), 'id'],
      ] as const) {
        const got = await rawUnary(client, path, bytes);
        expect(got, path).toMatchObject({ code: status.INVALID_ARGUMENT, field });
        expect(got.details, path).toContain(`${field}: `);
      }
      const watch = client.makeServerStreamRequest(
        '/rollout.v1.RolloutService/Watch',
        (b: Uint8Array) => Buffer.from(b),
        (b: Buffer) => WatchResponse.decode(b),
        encodeFields([len(1, bad)]),
        new Metadata(),
      );
      const watched = await new Promise<ServiceError>((resolve) => watch.on('error', resolve));
      expect(watched.code).toBe(status.INVALID_ARGUMENT);
      expect(watched.metadata.get('rollout-field')).toEqual(['environments']);
      // A legitimate U+FFFD (valid UTF-8) on a unary call is a task id like any other.
      expect((await rawUnary(client, '/rollout.v1.RolloutService/GetTrajectory', encodeFields([len(1, utf8('utf8-legit-\uFFFD'))]))).code).toBe(status.OK);
    } finally {
      client.close();
    }
  });

  it('refuses a field sent with a wire type it does not have, naming it, instead of running the task with that field at its default', async () => {
    // Each case: a valid task's TaskSpec bytes with one more field appended (a later field wins in protobuf, and
    // the generated decoder skips one whose wire type is not its own: num_samples would silently be 1).
    const spec = (id: string): Uint8Array => TaskSpec.encode(TaskSpec.fromPartial({ ...mathTask(id, 1, 31) })).finish();
    const withField = (id: string, field: Uint8Array): Uint8Array => encodeFields([len(2, Uint8Array.from([...spec(id), ...field]))]);
    const value = (fields: Parameters<typeof encodeFields>[0]): Uint8Array => encodeFields(fields);
    const cases: [string, Uint8Array, string][] = [
      ['wt-samples', encodeFields([len(3, utf8('4'))]), 'num_samples'],
      ['wt-temperature', encodeFields([len(6, value([varint(1, 1n)]))]), 'sampling.temperature'],
      ['wt-seed', encodeFields([len(6, value([len(4, utf8('7'))]))]), 'sampling.seed'],
      ['wt-limits', encodeFields([varint(7, 3n)]), 'limits'],
      ['wt-meta', encodeFields([len(8, value([len(1, utf8('k')), varint(2, 1n)]))]), 'metadata'],
      // instance { n: <number_value sent as a varint> }: Struct.fields entry { key, Value { number_value } }.
      ['wt-instance', encodeFields([len(5, value([len(1, value([len(1, utf8('n')), len(2, value([varint(2, 3n)]))]))]))]), 'instance'],
      ['wt-include', encodeFields([len(9, utf8('yes'))]), 'include_messages'],
    ];
    const raw = rawRollout(h.server.address);
    try {
      for (const [id, field] of cases) raw.send(withField(id, field));
      // A cancel whose task_id is a varint: refused by field too (it would cancel the task with id "").
      raw.send(encodeFields([len(3, encodeFields([varint(1, 5n)]))]));
      // An unknown field (a newer client's) with any wire type is no reason to refuse.
      raw.send(withField('wt-unknown', encodeFields([len(99, utf8('from a newer contract')), varint(98, 1n)])));
      raw.end();
      const responses = await raw.responses;
      expect(await raw.status).toBe(status.OK);
      const answers = responses.flatMap((r) => (r.kind?.$case === 'accepted' || r.kind?.$case === 'rejected' ? [r.kind] : []));
      expect(answers.map((a) => `${a.$case} ${a.value.taskId} ${a.$case === 'rejected' ? a.value.field : ''}`)).toEqual([
        ...cases.map(([id, , field]) => `rejected ${id} ${field}`),
        'rejected  cancel.task_id',
        'accepted wt-unknown ',
      ]);
      for (const a of answers) if (a.$case === 'rejected') expect(a.value.reason).toContain('wrong wire type');
      expect(answers[0]!.value).toMatchObject({ reason: expect.stringContaining('num_samples is int32 (varint), sent as length-delimited') as unknown });
    } finally {
      raw.client.close();
    }
    const client = new Client(h.server.address, credentials.createInsecure());
    try {
      const submit = Uint8Array.from([0x0a, ...withField('wt-submit', encodeFields([len(3, utf8('4'))])).subarray(1)]);
      const got = await rawUnary(client, '/rollout.v1.RolloutService/Submit', submit);
      expect(got).toMatchObject({ code: status.INVALID_ARGUMENT, field: 'task.num_samples' });
    } finally {
      client.close();
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
        } else if (!request.kind || request.kind.$case === 'open') expectedAnswers++;
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
      // One answer per message that decoded to a task, an open or no kind at all, or did not decode; plus the final task's.
      expect(answers).toHaveLength(expectedAnswers + 1);
      const trajectories: Trajectory[] = responses.flatMap((r) => (r.kind?.$case === 'trajectory' ? [r.kind.value] : []));
      expect(trajectories.some((t) => t.taskId === 'fuzz-final' && OK.has(t.status))).toBe(true);
      for (const t of trajectories) expect(invariantViolations(t)).toEqual([]);
    } finally {
      raw.client.close();
    }
  });
});
