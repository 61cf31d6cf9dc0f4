import type { ServiceDefinition } from '@grpc/grpc-js';
import { BinaryWriter } from '@bufbuild/protobuf/wire';
import { RolloutResponse, Trajectory, WatchResponse, type GetTrajectoryResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { encodedTrajectory, wireSafe } from '../pipeline/wire-safe.js';

/** Field numbers that carry a Trajectory in each response (see rollout.proto). */
const ROLLOUT_TRAJECTORY = 5;
const WATCH_TRAJECTORY = 3;
const GET_TRAJECTORIES = 1;
const GET_PENDING = 2;

/**
 * Response serializers that write each trajectory's bytes as the pipeline encoded them (wireSafe), instead of
 * encoding it again for every stream and watcher that sends it — and that never throw: a trajectory that did not
 * come through wireSafe is made safe here, so no response can end a call with "Error serializing response".
 * Other responses encode as generated.
 */
export function trajectorySerializers<S extends ServiceDefinition>(service: S, maxMessageBytes: number): S {
  const bytesOf = (t: Trajectory): Uint8Array => encodedTrajectory(t) ?? encodedTrajectory(wireSafe(t, maxMessageBytes))!;
  const serializers: Record<string, (message: never) => Buffer> = {
    '/rollout.v1.RolloutService/Rollout': (m: RolloutResponse) =>
      m.kind?.$case === 'trajectory' ? frame([[ROLLOUT_TRAJECTORY, bytesOf(m.kind.value)]]) : toBuffer(RolloutResponse.encode(m).finish()),
    '/rollout.v1.RolloutService/Watch': (m: WatchResponse) =>
      m.kind?.$case === 'trajectory' ? frame([[WATCH_TRAJECTORY, bytesOf(m.kind.value)]]) : toBuffer(WatchResponse.encode(m).finish()),
    '/rollout.v1.RolloutService/GetTrajectory': (m: GetTrajectoryResponse) =>
      frame(
        m.trajectories.map((t) => [GET_TRAJECTORIES, bytesOf(t)] as const),
        m.pending !== 0 ? [GET_PENDING, m.pending] : undefined,
      ),
  };
  const out: Record<string, unknown> = {};
  for (const [name, method] of Object.entries(service)) {
    const serialize = serializers[method.path];
    out[name] = serialize ? { ...method, responseSerialize: serialize } : method;
  }
  return out as S;
}

/**
 * The exact encoded size of a GetTrajectoryResponse, as {@link trajectorySerializers} writes it (what grpc-js compares
 * with its send limit): counted from the stored bytes, so a response too large to send is refused before any of it
 * is copied into one buffer.
 */
export function getTrajectoryResponseBytes(m: GetTrajectoryResponse): number {
  let bytes = m.pending !== 0 ? 1 + (m.pending < 0 ? 10 : varintBytes(m.pending)) : 0;
  for (const t of m.trajectories) {
    const length = (encodedTrajectory(t) ?? Trajectory.encode(t).finish()).length;
    bytes += 1 + varintBytes(length) + length;
  }
  return bytes;
}

/** Bytes of a non-negative integer as a varint. */
function varintBytes(value: number): number {
  let bytes = 1;
  for (let v = value; v >= 128; v = Math.floor(v / 128)) bytes++;
  return bytes;
}

/** Length-delimited fields in order, then an optional int32 field. */
function frame(fields: readonly (readonly [number, Uint8Array])[], int32?: readonly [number, number]): Buffer {
  const writer = new BinaryWriter();
  for (const [field, bytes] of fields) writer.uint32((field << 3) | 2).bytes(bytes);
  if (int32) writer.uint32(int32[0] << 3).int32(int32[1]);
  return toBuffer(writer.finish());
}

function toBuffer(bytes: Uint8Array): Buffer {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/**
 * Encoded size of a response, for the byte bounds of outboxes and sessions: a trajectory's bytes as wireSafe kept
 * them (no second encode), anything else encoded (control and stage messages are small).
 */
export function rolloutResponseBytes(m: RolloutResponse): number {
  return m.kind?.$case === 'trajectory' ? trajectoryBytes(m.kind.value) : RolloutResponse.encode(m).finish().length;
}

/** {@link rolloutResponseBytes} for Watch. */
export function watchResponseBytes(m: WatchResponse): number {
  return m.kind?.$case === 'trajectory' ? trajectoryBytes(m.kind.value) : WatchResponse.encode(m).finish().length;
}

/** Encoded bytes of a trajectory (plus its field tag and length); encoded here if it did not come through wireSafe. */
export function trajectoryBytes(t: Trajectory): number {
  return framedBytes(encodedTrajectory(t) ?? Trajectory.encode(t).finish());
}

/** A trajectory's encoded bytes as a response carries them: plus its field tag and length (at most 6 bytes). */
export function framedBytes(encoded: Uint8Array): number {
  return encoded.length + 6;
}
