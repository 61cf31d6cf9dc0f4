import { Trajectory, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { encodeTrajectory } from './trajectory-encode.js';

/** Room left in a message beside the trajectory (the response's oneof tag and length, a degraded error text). */
const ENVELOPE_BYTES = 16 * 1024;
/** A degraded trajectory's error text is bounded too. */
const MAX_ERROR_CHARS = 4096;

/** The encoded bytes of each trajectory made wire-safe, so every stream that sends it reuses one encode. */
const encoded = new WeakMap<Trajectory, Uint8Array>();

/** The bytes {@link wireSafe} encoded for this trajectory, if it went through it. */
export function encodedTrajectory(trajectory: Trajectory): Uint8Array | undefined {
  return encoded.get(trajectory);
}

/**
 * A finished trajectory as the task store keeps it: only the bytes wireSafe encoded (what every stream sends), not
 * the object. A 64K-token trajectory's token arrays as JS numbers are ~2 MB on the V8 heap — four arrays the
 * garbage collector copies when they are promoted and marks through at every full collection for as long as the
 * task is retained (up to `retainFinishedTasks`/`retainFinishedBytes`) — where its bytes are ~0.3 MB off the heap.
 * Whoever needs the object again (GetTrajectory, a re-submitted task's replay) gets one that is sent as these same
 * bytes and decodes them only if its fields are read: what a client would decode from the wire (logprobs as float32).
 */
export class StoredTrajectory {
  private constructor(
    readonly bytes: Uint8Array,
    /** Fields read without decoding (a session's ack bookkeeping reads these). */
    private readonly identity: Pick<Trajectory, IdentityField>,
  ) {}

  get taskId(): string {
    return this.identity.taskId;
  }

  get sampleIndex(): number {
    return this.identity.sampleIndex;
  }

  /** The trajectory's wire bytes (encoding it through wireSafe if nothing did yet: such a trajectory may be degraded). */
  static of(trajectory: Trajectory): StoredTrajectory {
    const safe = encodedTrajectory(trajectory) === undefined ? wireSafe(trajectory, Number.MAX_SAFE_INTEGER) : trajectory;
    const { taskId, sampleIndex, groupId, status } = safe;
    return new StoredTrajectory(encodedTrajectory(safe)!, { taskId, sampleIndex, groupId, status });
  }

  /**
   * The trajectory, decoded from its bytes when a field is first read (a read-only object: assigning, defining or
   * deleting a field throws in strict code). It is registered with the bytes, so sending it — GetTrajectory, a replay
   * or re-send to a stream — writes them without decoding at all; only code that reads its fields pays for the decode
   * (~2 ms for 64K tokens), once. A Proxy over the fields, so making one costs ~0.1 µs (own accessors defined per
   * object cost ~9 µs: a resumed session re-sends every unacked trajectory through this, in one go); to spreads,
   * JSON, Object.keys and equality it is an object with every Trajectory field as its own enumerable property.
   * `util.inspect` shows a Proxy's empty target unless asked to show proxies.
   */
  trajectory(): Trajectory {
    const lazy = new Proxy({}, new LazyFields(this.bytes, this.identity)) as Trajectory;
    encoded.set(lazy, this.bytes);
    return lazy;
  }
}

/** Proxy handler of {@link StoredTrajectory.trajectory}: identity fields as kept, the others from one decode. */
class LazyFields implements ProxyHandler<object> {
  private decoded: Trajectory | undefined;

  constructor(
    private readonly bytes: Uint8Array,
    private readonly identity: Pick<Trajectory, IdentityField>,
  ) {}

  private field(key: keyof Trajectory): unknown {
    if (key in this.identity) return this.identity[key as IdentityField];
    return (this.decoded ??= Trajectory.decode(this.bytes))[key];
  }

  get(target: object, key: string | symbol, receiver: unknown): unknown {
    return typeof key === 'string' && FIELD_SET.has(key) ? this.field(key as keyof Trajectory) : Reflect.get(target, key, receiver);
  }

  has(target: object, key: string | symbol): boolean {
    return (typeof key === 'string' && FIELD_SET.has(key)) || Reflect.has(target, key);
  }

  ownKeys(): string[] {
    return [...TRAJECTORY_FIELDS];
  }

  getOwnPropertyDescriptor(_target: object, key: string | symbol): PropertyDescriptor | undefined {
    if (typeof key !== 'string' || !FIELD_SET.has(key)) return undefined;
    return { value: this.field(key as keyof Trajectory), writable: false, enumerable: true, configurable: true };
  }

  set(): boolean {
    return false;
  }

  defineProperty(): boolean {
    return false;
  }

  deleteProperty(): boolean {
    return false;
  }
}

type IdentityField = 'taskId' | 'sampleIndex' | 'groupId' | 'status';

/** Every field of a Trajectory (the generated base object has them all). */
const TRAJECTORY_FIELDS = Object.keys(Trajectory.fromPartial({})) as (keyof Trajectory)[];
const FIELD_SET: ReadonlySet<string> = new Set(TRAJECTORY_FIELDS);

/** What a trajectory loses, in order, until it encodes and fits. */
const DEGRADE_STEPS: readonly [string, (t: Trajectory) => Trajectory][] = [
  ['eval_report, reward_details', (t) => ({ ...t, evalReport: undefined, rewardDetails: {}, reward: 0 })],
  ['messages', (t) => ({ ...t, messages: [] })],
  ['token ids, mask, logprobs and turns', (t) => ({ ...t, promptTokenIds: [], responseTokenIds: [], responseMask: [], responseLogprobs: [], turns: [] })],
  ['metadata', (t) => ({ ...t, metadata: {} })],
];

/**
 * Makes a trajectory safe to put on the wire before anything queues it: it is encoded once here (the bytes are
 * kept for the streams that send it) and checked against the message limit. One that cannot be encoded (an
 * environment's report holding a bigint or a cycle) or is over the limit would otherwise end every stream it is
 * written to — and, unacked, be re-sent first on resume, bricking the session for good. Such a trajectory is
 * degraded instead: the offending fields are dropped (report first, then the transcript, then token arrays)
 * until it fits, and a policy outcome (COMPLETED, TRUNCATED) becomes ENVIRONMENT_ERROR with an error saying what
 * was dropped and why. Failure statuses keep their status; their error text says what was dropped.
 */
export function wireSafe(trajectory: Trajectory, maxBytes: number): Trajectory {
  const limit = Math.max(1024, maxBytes - ENVELOPE_BYTES);
  const first = tryEncode(trajectory);
  if (first.bytes && first.bytes.length <= limit) {
    encoded.set(trajectory, first.bytes);
    return trajectory;
  }
  const problem = first.bytes ? `is ${first.bytes.length} bytes, over the ${limit}-byte limit of a message` : `could not be encoded (${first.error})`;
  const policyOutcome =
    trajectory.status === TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED || trajectory.status === TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED;
  let current: Trajectory = policyOutcome ? { ...trajectory, status: TrajectoryStatus.TRAJECTORY_STATUS_ENVIRONMENT_ERROR, finishReason: 'error' } : trajectory;
  const dropped: string[] = [];
  for (const [name, drop] of DEGRADE_STEPS) {
    current = drop(current);
    dropped.push(name);
    const before = trajectory.error ? `; before that: ${trajectory.error}` : '';
    const error = `the trajectory ${problem}; dropped ${dropped.join(', ')}${before}`;
    current = { ...current, error: error.length > MAX_ERROR_CHARS ? `${error.slice(0, MAX_ERROR_CHARS)}…` : error };
    const attempt = tryEncode(current);
    if (attempt.bytes && attempt.bytes.length <= limit) {
      encoded.set(current, attempt.bytes);
      return current;
    }
  }
  // Every field that can fail or grow is gone; what is left (ids, enums, bounded strings) always encodes.
  const bare = Trajectory.fromPartial({
    taskId: trajectory.taskId,
    sampleIndex: trajectory.sampleIndex,
    groupId: trajectory.groupId,
    environment: trajectory.environment,
    status: current.status,
    finishReason: current.finishReason,
    error: `the trajectory ${problem}; only its identity is kept`,
    timing: trajectory.timing,
  });
  encoded.set(bare, encodeTrajectory(bare));
  return bare;
}

function tryEncode(trajectory: Trajectory): { bytes?: Uint8Array; error?: string } {
  try {
    // The generated encoder's bytes, token arrays written in one pass (a 64K-token trajectory blocked the loop for ms).
    return { bytes: encodeTrajectory(trajectory) };
  } catch (err) {
    return { error: err instanceof Error ? `${err.name}: ${err.message}` : String(err) };
  }
}
