import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { Role, Trajectory, TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { encodeTrajectory } from '../../src/pipeline/trajectory-encode.js';
import { attachVarints, packedVarints } from '../../src/tokens/packed-varints.js';

const generated = (t: Trajectory): Uint8Array => Trajectory.encode(t).finish();

/** Any int32, weighted toward what token arrays hold (ids, 0/1) and the varint length boundaries. */
const int32 = fc.oneof(
  fc.integer({ min: 0, max: 151_935 }),
  fc.constantFrom(0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455, 268_435_456, 2_147_483_647, -1, -2_147_483_648),
  fc.integer({ min: -2_147_483_648, max: 2_147_483_647 }),
);
const float = fc.oneof(fc.double({ min: -50, max: 0, noNaN: true }), fc.constantFrom(0, -0, 1e-5, -1e-45, -Infinity, Infinity, NaN, -3.4e38), fc.double());

const trajectory = fc.record({
  taskId: fc.string(),
  sampleIndex: fc.integer({ min: 0, max: 1000 }),
  groupId: fc.string(),
  environment: fc.string(),
  status: fc.constantFrom(...Object.values(TrajectoryStatus).filter((v): v is TrajectoryStatus => typeof v === 'number' && v >= 0)),
  finishReason: fc.string(),
  error: fc.string(),
  promptTokenIds: fc.array(int32, { maxLength: 200 }),
  responseTokenIds: fc.array(int32, { maxLength: 200 }),
  responseMask: fc.array(fc.oneof(fc.constantFrom(0, 1), int32), { maxLength: 200 }),
  responseLogprobs: fc.array(float, { maxLength: 200 }),
  reward: fc.double({ noNaN: true }),
  rewardDetails: fc.dictionary(fc.string(), fc.double({ noNaN: true }), { maxKeys: 3 }),
  numTurns: fc.integer({ min: 0, max: 50 }),
  policyVersionMin: fc.integer({ min: 0, max: 1 << 30 }),
  metadata: fc.dictionary(fc.string(), fc.string(), { maxKeys: 3 }),
  stale: fc.boolean(),
});

describe('encodeTrajectory', () => {
  it('writes exactly the generated encoder\'s bytes for any trajectory', () => {
    fc.assert(
      fc.property(trajectory, (partial) => {
        const t = Trajectory.fromPartial({
          ...partial,
          turns: [{ role: Role.ROLE_ASSISTANT, start: 0, end: partial.responseTokenIds.length, backend: 'b' }],
          messages: [{ role: 'user', content: 'hi' }],
          timing: { totalMs: 12.5 },
          evalReport: { ok: true, n: [1, 'two'] },
        });
        let expected: Uint8Array;
        try {
          expected = generated(t);
        } catch (err) {
          // A value the generated encoder refuses (a float beyond float32): refused the same way.
          expect(() => encodeTrajectory(t)).toThrow((err as Error).message);
          return;
        }
        expect(Buffer.from(encodeTrajectory(t)).equals(Buffer.from(expected))).toBe(true);
      }),
      { numRuns: 300 },
    );
  });

  it('writes a 64K-token trajectory as the generated encoder does, and it decodes to the same arrays', () => {
    const prompt = Array.from({ length: 55_000 }, (_, i) => (i * 7919) % 151_936);
    const response = Array.from({ length: 9_000 }, (_, i) => (i * 31) % 151_936);
    const t = Trajectory.fromPartial({
      taskId: 'long',
      promptTokenIds: prompt,
      responseTokenIds: response,
      responseMask: response.map((_, i) => i % 2),
      responseLogprobs: response.map((_, i) => (i % 2 === 0 ? 0 : -i / 9_000)),
    });
    const bytes = encodeTrajectory(t);
    expect(Buffer.from(bytes).equals(Buffer.from(generated(t)))).toBe(true);
    const back = Trajectory.decode(bytes);
    expect(back.promptTokenIds).toEqual(prompt);
    expect(back.responseTokenIds).toEqual(response);
  });

  it('copies a prompt\'s attached varints, and the bytes are still the generated encoder\'s', () => {
    fc.assert(
      fc.property(trajectory, fc.array(fc.integer({ min: 0, max: 2_147_483_647 }), { maxLength: 300 }), (partial, prompt) => {
        const t = Trajectory.fromPartial({ ...partial, promptTokenIds: prompt, responseLogprobs: partial.responseLogprobs.map(Math.fround) });
        attachVarints(t.promptTokenIds, packedVarints(t.promptTokenIds)!);
        let expected: Uint8Array;
        try {
          expected = generated(t);
        } catch {
          return; // refused for another field (covered above)
        }
        expect(Buffer.from(encodeTrajectory(t)).equals(Buffer.from(expected))).toBe(true);
      }),
      { numRuns: 200 },
    );
  });

  it('uses the attached varints instead of encoding the ids again', () => {
    const t = Trajectory.fromPartial({ promptTokenIds: [1, 2, 3] });
    // Deliberately not the ids' varints: only a copy of the attached bytes can produce them.
    attachVarints(t.promptTokenIds, Uint8Array.of(0x7f, 0x7f));
    const bytes = encodeTrajectory(t);
    expect(Trajectory.decode(bytes).promptTokenIds).toEqual([127, 127]);
  });

  it('leaves ids it cannot write as varints to the generated encoder', () => {
    expect(packedVarints([1, -1])).toBeUndefined();
    expect(packedVarints([1.5])).toBeUndefined();
    expect(packedVarints([2 ** 31])).toBeUndefined();
    expect(packedVarints([])).toEqual(new Uint8Array(0));
    expect(packedVarints([0, 127, 128, 300])).toEqual(Uint8Array.of(0, 0x7f, 0x80, 0x01, 0xac, 0x02));
  });

  it('refuses what the generated encoder refuses, with its error', () => {
    for (const bad of [{ promptTokenIds: [1.5] }, { responseMask: [2 ** 31] }, { responseLogprobs: [1e300] }]) {
      const t = Trajectory.fromPartial(bad);
      expect(() => encodeTrajectory(t)).toThrow(/invalid (int32|float32)/);
    }
  });
});
