import { Client, credentials, Metadata, status, type ServiceError } from '@grpc/grpc-js';
import { WireType } from '@bufbuild/protobuf/wire';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultRegistry } from '../../src/environments/registry.js';
import { calcPolicy, CALC_ENVIRONMENT, createCalcEnvironment } from '../../src/testing/calc-environment.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import {
  RolloutRequest,
  Role,
  SubmitRequest,
  SubmitResponse,
  TaskSpec,
  TrajectoryStatus,
  type RolloutResponse,
  type StalenessAction,
  type TaskRejected,
  type Trajectory,
} from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { rawRollout } from '../support/raw-rollout.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { within } from '../support/wait.js';
import { encodeFields, INVALID_UTF8, len, mutationOf, splice, unknownField, utf8, varint, type RawField } from '../support/wire-bytes.js';

// Wire-level fuzzing of the Rollout stream with fast-check, against a live server: bytes no stub would send
// (mutations of valid encodings, wrong wire types, lengths past the end, unknown fields, invalid UTF-8, Structs
// nested hundreds deep, random bytes) and well-formed but hostile TaskSpecs (NaN/Inf floats, negative counts,
// huge and empty strings, unknown enum values, duplicated ids, cancels and acks of unknown ids, requests out of
// order), 10,000+ in all, many per stream. Asserted: the server never crashes or ends a stream, every request that
// deserves an answer gets exactly one, a rejection names the field (exactly, where the test knows which field it
// broke), and good tasks interleaved on the same streams and on a clean stream beside them complete with
// trajectories whose every policy token is what the engine sampled. Seeds are fixed (printed), so a failure
// replays. hostile-requests.test.ts holds the hand-picked cases this generalises.

const SEED = 20_261_124;
const S = TrajectoryStatus;
const OK = new Set([S.TRAJECTORY_STATUS_COMPLETED, S.TRAJECTORY_STATUS_TRUNCATED]);
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);
/**
 * A field path a rejection may name: a request field below the stream's request (the `task.` prefix dropped), or
 * `kind` for a request with none; map and Struct entries are named by key, any key (`metadata.k`, `instance.answer`).
 */
const FIELD_PATH = /^$|^(kind|open|cancel|ack|task|task_id|group_id|num_samples|environment|instance|sampling|limits|metadata|include_messages)(\.[a-z_]+)*$|^(instance|metadata)\..+$/;
/** Bound for one stream's whole run (thousands of requests and the tasks accepted among them) on a busy 2-core box. */
const STREAM_BOUND_MS = 240_000;

/** What one request must get back. */
type Expect =
  /** Exactly one rejection naming this field (`instance*`: the field or one below it). */
  | { answer: 'rejected'; field: string }
  | { answer: 'accepted' }
  /** One answer, either way (a mutation whose validity the test does not predict). */
  | { answer: 'one' }
  | { answer: 'none' }
  /** No answer, or one rejection (a mutated cancel or ack: refused when one of its fields has another wire type). */
  | { answer: 'noneOrRejected' };

interface Case {
  bytes: Uint8Array;
  /** The task id the answer carries; undefined when unknown (bytes that do not decode). */
  taskId?: string;
  expect: Expect;
  what: string;
}

/** An arithmetic task of the calc environment (in-process tool, no sandbox process); `id` makes it unique. */
function goodSpec(id: string, extra: Partial<TaskSpec> = {}): TaskSpec {
  const base = mathTask(id, 1, hash(id), { environment: CALC_ENVIRONMENT });
  return TaskSpec.fromPartial({ ...base, sampling: { temperature: 1, seed: hash(id), maxTokensPerTurn: 128, maxTotalTokens: 4096, stop: [] }, ...extra });
}

function hash(s: string): number {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619) >>> 0;
  return h % 100_000;
}

const taskBytes = (spec: TaskSpec): Uint8Array => RolloutRequest.encode({ kind: { $case: 'task', value: spec } }).finish();
const openBytes = (sessionId: string): Uint8Array => RolloutRequest.encode({ kind: { $case: 'open', value: { sessionId, resume: false, stageEvents: false } } }).finish();
const taskSpecBytes = (spec: TaskSpec): Uint8Array => TaskSpec.encode(spec).finish();
/** A RolloutRequest whose task is these raw TaskSpec fields. */
const rawTask = (fields: readonly RawField[]): Uint8Array => encodeFields([len(2, encodeFields(fields))]);

/** An instance nested `depth` objects deep below `extra` (or lists, when `lists`). */
function nested(depth: number, lists: boolean): unknown {
  let value: unknown = { a: 1 };
  for (let i = 1; i < depth; i++) value = lists ? [value] : { x: value };
  return value;
}

/** The answer a request's bytes deserve, decided by decoding them with the contract's generated decoder. */
function byDecoding(bytes: Uint8Array, what: string): Case {
  let request: RolloutRequest;
  try {
    request = RolloutRequest.decode(bytes);
  } catch {
    return { bytes, what, expect: { answer: 'rejected', field: '*' } };
  }
  const kind = request.kind;
  // No kind set (a kind with the wrong wire type, only unknown fields, nothing): refused, naming the kind or `kind`.
  if (!kind) return { bytes, what, expect: { answer: 'rejected', field: '*' } };
  // U+FFFD where the generated decoder met invalid UTF-8 (refused by field, a cancel or ack too) or, in these fixed
  // samples never, a real one: one answer, the task id not known.
  if (JSON.stringify(request).includes('\uFFFD')) return { bytes, what, expect: { answer: 'one' } };
  if (kind.$case === 'task') return { bytes, what, taskId: kind.value.taskId, expect: { answer: 'one' } };
  if (kind.$case === 'open') return { bytes, what, taskId: '', expect: { answer: 'rejected', field: 'open' } };
  // A cancel or ack is answered only when one of its fields came with a wire type it does not have; a mutation
  // decides that in ways this oracle does not predict (hostile-requests.test.ts holds the exact cases).
  return { bytes, what, expect: { answer: 'noneOrRejected' } };
}

/** Malformed-bytes cases for stream `s`: each built to break the wire format in one known way. */
function malformedCases(s: string): fc.Arbitrary<Case>[] {
  const base = goodSpec(`fz${s}-base`, { instance: { problem: 'What is 2 + 3?', answer: '5', row: { id: 7, tags: ['a', 'b'], deep: nested(6, false) } }, metadata: { k: 'v' } });
  const validTask = taskBytes(base);
  const others = [
    openBytes(`fz${s}-again`),
    RolloutRequest.encode({ kind: { $case: 'cancel', value: { taskId: `fz${s}-nope` } } }).finish(),
    RolloutRequest.encode({ kind: { $case: 'ack', value: { taskIds: [`fz${s}-nope`], trajectories: [{ taskId: `fz${s}-nope`, sampleIndex: 3 }] } } }).finish(),
  ];
  const id = (tag: string) => fc.nat(1_000_000_000).map((n) => `fz${s}-${tag}-${n}`);
  return [
    // Mutations of valid encodings: whatever they decode to decides the answer.
    mutationOf(validTask).map((b) => byDecoding(b, 'mutated task')),
    fc.constantFrom(...others).chain((o) => mutationOf(o)).map((b) => byDecoding(b, 'mutated open/cancel/ack')),
    fc.uint8Array({ minLength: 1, maxLength: 96 }).map((b) => byDecoding(b, 'random bytes')),
    // A length past the end of the message, in a known field: rejected naming it.
    fc
      .record({ taskId: id('len'), field: fc.constantFrom<[number, string]>([4, 'environment'], [5, 'instance'], [6, 'sampling'], [7, 'limits'], [8, 'metadata'], [2, 'group_id']), n: fc.integer({ min: 64, max: 0xffff_fff0 }) })
      .map(({ taskId, field: [no, name], n }): Case => ({
        bytes: rawTask([len(1, utf8(taskId)), len(no, utf8('xy'), n)]),
        taskId,
        what: `giant length in ${name}`,
        expect: { answer: 'rejected', field: name },
      })),
    fc.integer({ min: 64, max: 0xffff_fff0 }).map((n): Case => ({ bytes: encodeFields([len(2, utf8('abc'), n)]), what: 'giant length of the task', expect: { answer: 'rejected', field: 'task' } })),
    // A field of the contract with a wire type it does not have.
    fc
      .record({ taskId: id('wt'), no: fc.integer({ min: 2, max: 9 }), wt: fc.constantFrom(WireType.Varint, WireType.Bit32, WireType.Bit64, WireType.LengthDelimited, WireType.StartGroup, WireType.EndGroup) })
      .map(({ taskId, no, wt }) => {
        const payload = wt === WireType.Varint ? 5n : wt === WireType.Bit32 ? new Uint8Array(4) : wt === WireType.Bit64 ? new Uint8Array(8) : utf8('zz');
        const spec = concat(taskSpecBytes(goodSpec(taskId)), encodeFields([{ no, wireType: wt, payload }]));
        return byDecoding(encodeFields([len(2, spec)]), `wire type ${wt} for field ${no}`);
      }),
    // Unknown fields (a newer client's): ignored, the task runs.
    fc.record({ taskId: id('uf'), extra: fc.array(unknownField(), { minLength: 1, maxLength: 4 }), outer: fc.boolean() }).map(({ taskId, extra, outer }): Case => {
      const spec = taskSpecBytes(goodSpec(taskId));
      const bytes = outer ? concat(encodeFields([len(2, spec)]), encodeFields(extra)) : encodeFields([len(2, concat(spec, encodeFields(extra)))]);
      return { bytes, taskId, what: 'unknown fields', expect: { answer: 'accepted' } };
    }),
    // Invalid UTF-8 in a string field (or a key): refused naming it, never decoded with U+FFFD in its place; a U+FFFD
    // sent as UTF-8 is a character like any other.
    fc
      .record({
        taskId: id('u8'),
        bad: fc.constantFrom(...INVALID_UTF8),
        where: fc.constantFrom('environment', 'task_id', 'metadata.k', 'metadata', 'group_id', 'instance.hint', 'legit'),
      })
      .map(({ taskId, bad, where }): Case => {
        const spec = goodSpec(taskId);
        const legit = utf8('\uFFFD');
        const fields: RawField[] = [len(1, where === 'task_id' ? concat(utf8(taskId), bad) : utf8(taskId))];
        if (where === 'environment') fields.push(len(4, concat(utf8(CALC_ENVIRONMENT), bad)));
        if (where === 'group_id') fields.push(len(2, concat(utf8('g'), bad)));
        if (where === 'metadata.k') fields.push(len(8, encodeFields([len(1, utf8('k')), len(2, concat(utf8('v'), bad))])));
        if (where === 'metadata') fields.push(len(8, encodeFields([len(1, concat(utf8('k'), bad)), len(2, utf8('v'))])));
        // After the task's own instance (the generated decoder keeps the last of a message field sent twice) and a
        // key it does not have: a value the decoder drops is never used, and not checked.
        const after: RawField[] = [];
        if (where === 'instance.hint') after.push(len(5, encodeFields([len(1, encodeFields([len(1, utf8('hint')), len(2, encodeFields([len(3, concat(utf8('5'), bad))]))]))])));
        if (where === 'legit') fields.push(len(2, concat(utf8('g'), legit)), len(8, encodeFields([len(1, legit), len(2, legit)])));
        const rest = TaskSpec.encode({ ...spec, taskId: '', ...(where === 'environment' && { environment: '' }) }).finish();
        const bytes = encodeFields([len(2, concat(concat(encodeFields(fields), rest), encodeFields(after)))]);
        if (where === 'legit') return { bytes, taskId, what: 'U+FFFD as UTF-8', expect: { answer: 'accepted' } };
        // A task_id that is not UTF-8 has no honest spelling: the rejection carries none.
        return { bytes, taskId: where === 'task_id' ? '' : taskId, what: `invalid UTF-8 in ${where}`, expect: { answer: 'rejected', field: where } };
      }),
    // A request with no kind: the kind sent with a wire type it does not have, or a kind this server does not know.
    fc
      .record({ no: fc.integer({ min: 1, max: 4 }), wt: fc.constantFrom(WireType.Varint, WireType.Bit32, WireType.Bit64) })
      .map(({ no, wt }): Case => {
        const payload = wt === WireType.Varint ? 5n : new Uint8Array(wt === WireType.Bit32 ? 4 : 8);
        const field = ['open', 'task', 'cancel', 'ack'][no - 1]!;
        return { bytes: encodeFields([{ no, wireType: wt, payload }]), taskId: '', what: `${field} as wire type ${wt}`, expect: { answer: 'rejected', field } };
      }),
    fc.array(unknownField(), { minLength: 1, maxLength: 3 }).map((extra): Case => ({ bytes: encodeFields(extra), taskId: '', what: 'an unknown kind', expect: { answer: 'rejected', field: 'kind' } })),
    // Structs (and lists) nested deep: too deep is refused naming `instance`; shallow enough runs.
    fc.record({ taskId: id('dn'), depth: fc.integer({ min: 1, max: 400 }), lists: fc.boolean() }).map(({ taskId, depth, lists }): Case => {
      const bytes = taskBytes(goodSpec(taskId, { instance: { problem: 'What is 1 + 1?', answer: '2', extra: nested(depth, lists) } }));
      // The decoder's guard counts messages (100): a level of objects is three (Struct, entry, Value), a level of
      // lists two (ListValue, Value). Near the edge either answer is fine.
      const [fits, refused] = lists ? [44, 48] : [30, 33];
      const expect: Expect = depth <= fits ? { answer: 'accepted' } : depth >= refused ? { answer: 'rejected', field: 'instance' } : { answer: 'one' };
      return { bytes, taskId, what: `${lists ? 'lists' : 'objects'} nested ${depth} deep`, expect };
    }),
    // int64 seeds written as raw varints: beyond ±(2^53−1) refused naming sampling.seed.
    fc.record({ taskId: id('sd'), v: fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }) }).map(({ taskId, v }): Case => {
      const spec = taskSpecBytes(goodSpec(taskId, { sampling: { temperature: 1, maxTokensPerTurn: 128, maxTotalTokens: 4096, stop: [] } }));
      const bytes = encodeFields([len(2, concat(spec, encodeFields([len(6, encodeFields([varint(4, v)]))])))]);
      const signed = v >= 1n << 63n ? v - (1n << 64n) : v;
      const exact = signed <= MAX_SAFE && signed >= -MAX_SAFE;
      return { bytes, taskId, what: `seed ${signed}`, expect: exact ? { answer: 'accepted' } : { answer: 'rejected', field: 'sampling.seed' } };
    }),
  ];
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  return splice(a, a.length, b);
}

/** Well-formed but hostile TaskSpecs for stream `s`, each with one known fault (or none: an extreme but valid one). */
function hostileCases(s: string): fc.Arbitrary<Case>[] {
  const nan = fc.constantFrom(Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY);
  const one = (field: string, patch: (spec: TaskSpec) => void): fc.Arbitrary<Case> =>
    fc.nat(1_000_000_000).map((n): Case => {
      const spec = goodSpec(`hz${s}-${field}-${n}`);
      patch(spec);
      return { bytes: taskBytes(spec), taskId: spec.taskId, what: `${field} ${JSON.stringify(spec, replacer).slice(0, 200)}`, expect: { answer: 'rejected', field } };
    });
  const bad = <T,>(field: string, values: fc.Arbitrary<T>, patch: (spec: TaskSpec, v: T) => void): fc.Arbitrary<Case> =>
    fc.tuple(fc.nat(1_000_000_000), values).map(([n, v]): Case => {
      const spec = goodSpec(`hz${s}-${field}-${n}`);
      patch(spec, v);
      return { bytes: taskBytes(spec), taskId: spec.taskId, what: `${field} = ${String(v).slice(0, 80)}`, expect: { answer: 'rejected', field } };
    });
  const neg = fc.integer({ min: -(2 ** 31), max: -1 });
  const limit = (name: 'maxTurns' | 'initTimeoutMs' | 'runTimeoutMs' | 'evalTimeoutMs' | 'totalTimeoutMs', field: string) =>
    bad(`limits.${field}`, neg, (spec, v) => {
      spec.limits = { maxTurns: 0, initTimeoutMs: 0, runTimeoutMs: 0, evalTimeoutMs: 0, totalTimeoutMs: 0, [name]: v };
    });
  const valid = fc
    .record({
      n: fc.nat(1_000_000_000),
      numSamples: fc.integer({ min: 1, max: 3 }),
      temperature: fc.oneof(fc.constantFrom(0, 100, 1e-30), fc.float({ min: 0, max: 100, noNaN: true })),
      topP: fc.oneof(fc.constant(1), fc.float({ min: Math.fround(0.01), max: 1, noNaN: true })),
      topK: fc.oneof(fc.constant(-1), fc.integer({ min: 1, max: 2 ** 31 - 1 })),
      seed: fc.oneof(fc.constantFrom(Number.MAX_SAFE_INTEGER, -Number.MAX_SAFE_INTEGER, 0), fc.integer()),
      maxTokensPerTurn: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 2 ** 31 - 1 })),
      maxTotalTokens: fc.oneof(fc.constant(0), fc.integer({ min: 4096, max: 2 ** 31 - 1 })),
      metadata: fc.dictionary(fc.string({ maxLength: 8, unit: 'grapheme' }), fc.string({ maxLength: 16, unit: 'grapheme' }), { maxKeys: 8 }),
      stop: fc.array(fc.string({ minLength: 1, maxLength: 8, unit: 'grapheme' }).filter((x) => x.length <= 256), { maxLength: 4 }),
      groupId: fc.string({ maxLength: 64, unit: 'grapheme' }).filter((x) => x.length <= 256),
      includeMessages: fc.boolean(),
    })
    .map((v): Case => {
      const spec = goodSpec(`hz${s}-valid-${v.n}`, {
        numSamples: v.numSamples,
        groupId: v.groupId,
        metadata: v.metadata,
        includeMessages: v.includeMessages,
        sampling: { temperature: v.temperature, topP: v.topP, topK: v.topK, seed: v.seed, maxTokensPerTurn: v.maxTokensPerTurn, maxTotalTokens: v.maxTotalTokens, stop: v.stop },
        limits: { maxTurns: 0, initTimeoutMs: 0, runTimeoutMs: 0, evalTimeoutMs: 0, totalTimeoutMs: 2 ** 31 - 1 },
      });
      return { bytes: taskBytes(spec), taskId: spec.taskId, what: `valid extremes ${JSON.stringify(spec, replacer).slice(0, 300)}`, expect: { answer: 'accepted' } };
    });
  return [
    bad('num_samples', fc.oneof(fc.integer({ min: -(2 ** 31), max: 0 }), fc.integer({ min: 257, max: 2 ** 31 - 1 })), (spec, v) => (spec.numSamples = v)),
    bad('sampling.temperature', fc.oneof(nan, fc.float({ min: Math.fround(-3e38), max: Math.fround(-1e-30), noNaN: true }), fc.float({ min: 101, max: Math.fround(3e38), noNaN: true })), (spec, v) => (spec.sampling!.temperature = v)),
    bad('sampling.top_p', fc.oneof(nan, fc.float({ min: Math.fround(-3e38), max: 0, noNaN: true }), fc.float({ min: Math.fround(1.01), max: Math.fround(3e38), noNaN: true })), (spec, v) => (spec.sampling!.topP = v)),
    bad('sampling.top_k', fc.oneof(fc.constant(0), fc.integer({ min: -(2 ** 31), max: -2 })), (spec, v) => (spec.sampling!.topK = v)),
    bad('sampling.max_tokens_per_turn', neg, (spec, v) => (spec.sampling!.maxTokensPerTurn = v)),
    bad('sampling.max_total_tokens', neg, (spec, v) => (spec.sampling!.maxTotalTokens = v)),
    bad('sampling.stop', fc.oneof(fc.array(fc.string({ minLength: 1, maxLength: 4 }), { minLength: 17, maxLength: 64 }), fc.constant(['']).map((x) => [...x]), fc.string({ minLength: 257, maxLength: 2000 }).map((x) => [x])), (spec, v) => (spec.sampling!.stop = v)),
    limit('maxTurns', 'max_turns'),
    limit('initTimeoutMs', 'init_timeout_ms'),
    limit('runTimeoutMs', 'run_timeout_ms'),
    limit('evalTimeoutMs', 'eval_timeout_ms'),
    limit('totalTimeoutMs', 'total_timeout_ms'),
    bad('limits.max_staleness', neg, (spec, v) => (spec.limits = { maxTurns: 0, initTimeoutMs: 0, runTimeoutMs: 0, evalTimeoutMs: 0, totalTimeoutMs: 0, maxStaleness: v })),
    bad('limits.staleness_action', fc.oneof(fc.integer({ min: 3, max: 2 ** 31 - 1 }), fc.integer({ min: -(2 ** 31), max: -1 })), (spec, v) => {
      spec.limits = { maxTurns: 0, initTimeoutMs: 0, runTimeoutMs: 0, evalTimeoutMs: 0, totalTimeoutMs: 0, stalenessAction: v as StalenessAction };
    }),
    bad('group_id', fc.string({ minLength: 257, maxLength: 5000 }).filter((x) => x.length > 256), (spec, v) => (spec.groupId = v)),
    bad('environment', fc.oneof(fc.constant(''), fc.string({ minLength: 1, maxLength: 300 }).filter((x) => x !== 'math' && x !== CALC_ENVIRONMENT)), (spec, v) => (spec.environment = v)),
    one('instance', (spec) => (spec.instance = undefined)),
    ...(
      [
        ['instance.problem', {}],
        ['instance.problem', { problem: '  ', answer: '1' }],
        ['instance.problem', { problem: 5, answer: '1' }],
        ['instance.answer', { problem: 'x' }],
        ['instance.answer', { problem: 'x', answer: [] }],
        ['instance.checker', { problem: 'x', answer: '1', checker: 'oracle' }],
      ] as const
    ).map(([field, instance]) => bad(field, fc.constant(instance), (spec, v) => (spec.instance = { ...v }))),
    bad('instance', fc.integer({ min: 65 * 1024, max: 200 * 1024 }), (spec, v) => (spec.instance = { problem: 'p'.repeat(v), answer: '1' })),
    bad('instance', fc.integer({ min: 1, max: 12 }), (spec, v) => (spec.sampling!.maxTotalTokens = v)),
    bad('metadata', fc.integer({ min: 65, max: 300 }), (spec, v) => (spec.metadata = Object.fromEntries(Array.from({ length: v }, (_, i) => [`k${i}`, 'v'])))),
    bad('metadata', fc.integer({ min: 16_385, max: 60_000 }), (spec, v) => (spec.metadata = { big: 'm'.repeat(v) })),
    bad('task_id', fc.string({ minLength: 257, maxLength: 5000 }).filter((x) => x.length > 256), (spec, v) => (spec.taskId = v)),
    valid,
  ];
}

function replacer(_key: string, value: unknown): unknown {
  return typeof value === 'number' && !Number.isFinite(value) ? String(value) : value;
}

/** Requests that deserve no answer (or a known one) and must not disturb anything: ids nobody has, wrong order. */
function orderCases(s: string): fc.Arbitrary<Case>[] {
  const anyId = fc.oneof(fc.string({ maxLength: 64 }), fc.string({ minLength: 1000, maxLength: 20_000 }), fc.constant(''));
  return [
    anyId.map((taskId): Case => ({ bytes: RolloutRequest.encode({ kind: { $case: 'cancel', value: { taskId: `hz${s}-x-${taskId}` } } }).finish(), what: 'cancel of an unknown id', expect: { answer: 'none' } })),
    fc.record({ ids: fc.array(anyId, { maxLength: 8 }), refs: fc.array(fc.record({ taskId: anyId, sampleIndex: fc.integer() }), { maxLength: 8 }) }).map(({ ids, refs }): Case => ({
      bytes: RolloutRequest.encode({ kind: { $case: 'ack', value: { taskIds: ids.map((x) => `hz${s}-x-${x}`), trajectories: refs.map((r) => ({ ...r, taskId: `hz${s}-x-${r.taskId}` })) } } }).finish(),
      what: 'ack of unknown trajectories',
      expect: { answer: 'none' },
    })),
    fc.string({ maxLength: 300 }).map((sessionId): Case => ({ bytes: openBytes(sessionId), taskId: '', what: 'open after the first request', expect: { answer: 'rejected', field: 'open' } })),
    fc.constant<Case>({ bytes: new Uint8Array(), taskId: '', what: 'an empty request', expect: { answer: 'rejected', field: 'kind' } }),
    fc.constant<Case>({ bytes: taskBytes(goodSpec('', {})), taskId: '', what: 'an empty task_id', expect: { answer: 'rejected', field: 'task_id' } }),
  ];
}

interface StreamRun {
  responses: RolloutResponse[];
  code: number;
  goodIds: string[];
}

/** Sends `cases` on one raw stream after an open, with a good task every `goodEvery` requests, and collects everything. */
async function runStream(h: ServerHarness, s: string, cases: readonly Case[], goodEvery: number): Promise<StreamRun> {
  const raw = rawRollout(h.server.address);
  const goodIds: string[] = [];
  try {
    raw.send(openBytes(`fuzz-${s}`));
    cases.forEach((c, i) => {
      raw.send(c.bytes);
      if (i % goodEvery === goodEvery - 1) {
        const id = `good-${s}-${i}`;
        goodIds.push(id);
        raw.send(taskBytes(goodSpec(id, { numSamples: 2 })));
      }
    });
    raw.end();
    const responses = await within(raw.responses, STREAM_BOUND_MS, `stream ${s}`);
    return { responses, code: await raw.status, goodIds };
  } finally {
    raw.client.close();
  }
}

/** Checks one stream's answers against its cases; returns the trajectories it delivered. */
function checkStream(run: StreamRun, cases: readonly Case[], sampled: Map<string, number[][]>): Trajectory[] {
  expect(run.code).toBe(status.OK);
  const answers = run.responses.flatMap((r) => (r.kind?.$case === 'accepted' || r.kind?.$case === 'rejected' ? [r.kind] : []));
  const rejected = answers.flatMap((a) => (a.$case === 'rejected' ? [a.value] : []));
  const accepted = answers.flatMap((a) => (a.$case === 'accepted' ? [a.value] : []));
  const expected = cases.filter((c) => c.expect.answer !== 'none' && c.expect.answer !== 'noneOrRejected').length + run.goodIds.length;
  const optional = cases.filter((c) => c.expect.answer === 'noneOrRejected').length;
  expect(answers.length, 'one answer per request that deserves one').toBeGreaterThanOrEqual(expected);
  expect(answers.length, 'one answer per request that deserves one').toBeLessThanOrEqual(expected + optional);

  // Every rejection says what to fix, and never hides an internal error.
  for (const r of rejected) {
    expect(r.field, r.reason).toMatch(FIELD_PATH);
    expect(r.reason).not.toBe('');
    expect(r.reason).not.toBe('internal error');
  }
  // Where the test knows the field it broke, the rejection names exactly that one.
  const byTask = new Map<string, (typeof answers)[number][]>();
  for (const a of answers) byTask.set(a.value.taskId, [...(byTask.get(a.value.taskId) ?? []), a]);
  for (const c of cases) {
    if (c.taskId === undefined || c.taskId === '' || c.expect.answer === 'none' || c.expect.answer === 'noneOrRejected') continue;
    const mine = byTask.get(c.taskId) ?? [];
    expect(mine.length, `${c.what}: answers for ${c.taskId.slice(0, 80)}`).toBeGreaterThanOrEqual(1);
    const e = c.expect;
    if (e.answer === 'accepted') expect(mine.map((a) => a.$case), c.what).toContain('accepted');
    if (e.answer === 'rejected' && e.field !== '*') {
      const fields = mine.flatMap((a) => (a.$case === 'rejected' ? [(a.value as TaskRejected).field] : []));
      expect(fields, `${c.what}: ${mine.map((a) => JSON.stringify(a.value).slice(0, 300)).join(' | ')}`).toContain(e.field);
    }
  }
  const emptyIdRejections = (field: string) => rejected.filter((r) => r.taskId === '' && r.field === field).length;
  for (const field of ['open', 'task', 'cancel', 'ack', 'kind', 'task_id']) {
    const want = cases.filter((c) => c.taskId === '' && c.expect.answer === 'rejected' && c.expect.field === field).length;
    expect(emptyIdRejections(field), `rejections of ${field} without a task id`).toBeGreaterThanOrEqual(want);
  }

  // Every accepted task delivers each of its samples exactly once; every trajectory keeps the invariants and holds
  // only tokens the engine sampled.
  const trajectories = run.responses.flatMap((r) => (r.kind?.$case === 'trajectory' ? [r.kind.value] : []));
  const keys = trajectories.map((t) => `${t.taskId}#${t.sampleIndex}`);
  expect(new Set(keys).size, 'no trajectory delivered twice').toBe(keys.length);
  const want = new Set(accepted.filter((a) => !a.duplicate).flatMap((a) => Array.from({ length: a.numSamples }, (_, i) => `${a.taskId}#${i}`)));
  expect(new Set(keys)).toEqual(want);
  for (const t of trajectories) checkTrajectory(t, sampled);
  for (const id of run.goodIds) {
    const mine = trajectories.filter((t) => t.taskId === id);
    expect(mine.map((t) => `${t.sampleIndex} ${TrajectoryStatus[t.status]} ${t.error}`)).toHaveLength(2);
    for (const t of mine) expect(OK.has(t.status), `${t.taskId}#${t.sampleIndex} ${TrajectoryStatus[t.status]} ${t.error}`).toBe(true);
  }
  const byField = new Map<string, number>();
  for (const r of rejected) byField.set(r.field || '(none)', (byField.get(r.field || '(none)') ?? 0) + 1);
  console.log(`stream: ${accepted.length} accepted, ${rejected.length} rejected by field ${JSON.stringify(Object.fromEntries([...byField].sort((a, b) => b[1] - a[1])))}`);
  return trajectories;
}

/** Invariants, and every assistant turn is exactly one completion the engine returned (its ids and logprobs). */
function checkTrajectory(t: Trajectory, sampled: Map<string, number[][]>): void {
  const at = `${t.taskId.slice(0, 60)}#${t.sampleIndex} ${TrajectoryStatus[t.status]} ${t.error}`;
  expect(t.status, at).not.toBe(S.TRAJECTORY_STATUS_UNSPECIFIED);
  expect(invariantViolations(t), at).toEqual([]);
  if (!OK.has(t.status)) expect(t.reward, at).toBe(0);
  for (const turn of t.turns.filter((x) => x.role === Role.ROLE_ASSISTANT)) {
    const ids = t.responseTokenIds.slice(turn.start, turn.end);
    const logprobs = t.responseLogprobs.slice(turn.start, turn.end);
    const samples = sampled.get(ids.join(',')) ?? [];
    expect(samples.some((s) => s.every((x, i) => x === logprobs[i])), `${at}: turn [${turn.start}, ${turn.end}) is not a completion the engine sampled`).toBe(true);
  }
}

describe('wire-level fuzzing of the Rollout stream (fast-check)', () => {
  let h: ServerHarness;
  /** Every completion the engine returned: ids → the logprobs of each time they were sampled. */
  const sampled = new Map<string, number[][]>();
  beforeAll(async () => {
    // No processes: the subject is the wire and admission, not sandboxes. A 64 KiB instance limit keeps the
    // oversized cases small.
    h = await startServerHarness({
      sandboxes: new NullSandboxDriver(),
      registry: defaultRegistry().register(createCalcEnvironment()),
      config: { maxInstanceBytes: 64 * 1024 },
      engine: {
        policy: calcPolicy,
        onCompletion: (c) => {
          const key = c.tokenIds.join(',');
          sampled.set(key, [...(sampled.get(key) ?? []), c.logprobs.map((x) => Math.fround(x))]);
        },
      },
    });
  });
  afterAll(async () => h?.close());

  it('10,000+ malformed and hostile requests on live streams: no crash, each answered by field, good tasks beside them intact', async () => {
    console.log(`wire-fuzz seed ${SEED}`);
    const malformed = ['a', 'b', 'c'].map((s, i) => fc.sample(fc.oneof(...malformedCases(s)), { seed: SEED + i, numRuns: 1_800 }));
    const hostile = ['d', 'e', 'f'].map((s, i) => fc.sample(fc.oneof(...hostileCases(s), ...orderCases(s)), { seed: SEED + 10 + i, numRuns: 1_700 }));
    // A clean stream beside the fuzzed ones, through the TypeScript client.
    const clean = (async () => {
      const session = h.client.openSession();
      for (let i = 0; i < 8; i++) await session.submit(mathTask(`clean-${i}`, 2, 7000 + i, { environment: CALC_ENVIRONMENT }));
      session.close();
      return collect(session.trajectories());
    })();
    const streams = [...malformed.map((cases, i) => ({ s: 'abc'[i]!, cases })), ...hostile.map((cases, i) => ({ s: 'def'[i]!, cases }))];
    const started = Date.now();
    const runs = await Promise.all(streams.map(({ s, cases }) => runStream(h, s, cases, 150)));
    const total = streams.reduce((n, x) => n + x.cases.length, 0);
    let delivered = 0;
    runs.forEach((run, i) => (delivered += checkStream(run, streams[i]!.cases, sampled).length));
    const cleanTrajectories = await within(clean, STREAM_BOUND_MS, 'the clean stream');
    expect(cleanTrajectories).toHaveLength(16);
    for (const t of cleanTrajectories) {
      expect(OK.has(t.status), `${t.taskId} ${TrajectoryStatus[t.status]} ${t.error}`).toBe(true);
      checkTrajectory(t, sampled);
    }
    console.log(`wire-fuzz: ${total} fuzzed requests on ${streams.length} streams, ${delivered} trajectories, ${Date.now() - started} ms`);
    expect(total).toBeGreaterThanOrEqual(10_000);
    // Still serving after it all.
    expect((await h.client.listEnvironments()).environments.map((e) => e.name)).toContain('math');
  }, 600_000);
  it('the same cases as unary Submit bytes: INVALID_ARGUMENT naming the field, never INTERNAL', async () => {
    // RolloutRequest.task is field 2, SubmitRequest.task field 1: the task cases' bytes with the outer tag swapped.
    const cases = [
      ...fc.sample(fc.oneof(...malformedCases('u')), { seed: SEED + 20, numRuns: 500 }),
      ...fc.sample(fc.oneof(...hostileCases('v')), { seed: SEED + 21, numRuns: 500 }),
    ].map((c) => {
      const bytes = Uint8Array.from(c.bytes);
      // Other requests (open, cancel, ack) mean something else as a SubmitRequest: only "one answer" is known.
      if (bytes[0] !== 0x12) return { ...c, bytes, expect: { answer: 'one' } as Expect };
      bytes[0] = 0x0a;
      return { ...c, bytes };
    });
    const client = new Client(h.server.address, credentials.createInsecure());
    const submit = (bytes: Uint8Array): Promise<{ code: number; details: string; field: string }> =>
      new Promise((resolve) => {
        client.makeUnaryRequest(
          '/rollout.v1.RolloutService/Submit',
          (b: Uint8Array) => Buffer.from(b),
          (b: Buffer) => SubmitResponse.decode(b),
          bytes,
          new Metadata(),
          (err: ServiceError | null) =>
            resolve(err ? { code: err.code, details: err.details, field: String(err.metadata.get('rollout-field')[0] ?? '') } : { code: status.OK, details: '', field: '' }),
        );
      });
    const codes = new Map<string, number>();
    try {
      for (const c of cases) {
        let decodes = true;
        let hasTask = false;
        try {
          hasTask = SubmitRequest.decode(c.bytes).task !== undefined;
        } catch {
          decodes = false;
        }
        const got = await submit(c.bytes);
        codes.set(status[got.code]!, (codes.get(status[got.code]!) ?? 0) + 1);
        const at = `${c.what}: ${status[got.code]} ${got.field} ${got.details.slice(0, 300)}`;
        expect(got.code, at).not.toBe(status.INTERNAL);
        if (!decodes || !hasTask) {
          expect(got.code, at).toBe(status.INVALID_ARGUMENT);
          continue;
        }
        const e = c.expect;
        if (e.answer === 'accepted') expect(got.code, at).toBe(status.OK);
        else expect([status.OK, status.INVALID_ARGUMENT], at).toContain(got.code);
        if (got.code === status.INVALID_ARGUMENT) expect(got.field.replace(/^task\./, ''), at).toMatch(FIELD_PATH);
        // Unary calls name the field from the request ("task.num_samples", "task.sampling.seed"), validation and
        // decoding alike; the stream's TaskRejected names it below the task.
        if (e.answer === 'rejected' && e.field !== '*') expect(got.field, at).toBe(e.field === 'task' ? 'task' : `task.${e.field}`);
      }
    } finally {
      client.close();
    }
    console.log(`wire-fuzz unary: ${cases.length} Submit calls: ${JSON.stringify(Object.fromEntries(codes))}`);
  }, 300_000);
});
