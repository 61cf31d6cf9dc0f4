import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { segmentSeed, turnSeed } from '../../src/pipeline/seeds.js';

describe('turnSeed', () => {
  it('is task seed + 1000 × sample + turn while that is exact', () => {
    expect(turnSeed(7, 0, 0)).toBe(7);
    expect(turnSeed(7, 3, 2)).toBe(3_007 + 2);
    expect(turnSeed(-5, 1, 0)).toBe(995);
  });

  it('property: every derived seed is an exact integer in the safe range, and distinct per (sample, turn) near 2^53', () => {
    fc.assert(
      fc.property(fc.integer({ min: -Number.MAX_SAFE_INTEGER, max: Number.MAX_SAFE_INTEGER }), fc.nat(255), fc.nat(999), (seed, sample, turn) => {
        const derived = turnSeed(seed, sample, turn);
        expect(Number.isSafeInteger(derived)).toBe(true);
        const exact = BigInt(seed) + BigInt(sample) * 1000n + BigInt(turn);
        const span = 2n ** 53n;
        expect(BigInt(derived)).toBe(exact < span && exact > -span ? exact : ((exact % span) + span) % span);
      }),
    );
    const top = Number.MAX_SAFE_INTEGER;
    const seeds = new Set<number>();
    for (let sample = 0; sample < 4; sample++) for (let turn = 0; turn < 4; turn++) seeds.add(turnSeed(top, sample, turn));
    expect(seeds.size).toBe(16);
  });
});

describe('segmentSeed', () => {
  it('is the turn seed for segment 0, and a distinct exact seed per later segment, also in the low 32 bits', () => {
    fc.assert(
      fc.property(fc.integer({ min: -Number.MAX_SAFE_INTEGER, max: Number.MAX_SAFE_INTEGER }), fc.nat(255), fc.nat(999), (seed, sample, turn) => {
        expect(segmentSeed(seed, sample, turn, 0)).toBe(turnSeed(seed, sample, turn));
        const seeds = [0, 1, 2, 3, 4, 5, 6, 7, 8].map((k) => segmentSeed(seed, sample, turn, k));
        for (const s of seeds) expect(Number.isSafeInteger(s)).toBe(true);
        expect(new Set(seeds).size).toBe(seeds.length);
        // llama.cpp keeps a seed's low 32 bits: the segments must still differ there.
        expect(new Set(seeds.map((s) => Number(BigInt.asUintN(32, BigInt(s))))).size).toBe(seeds.length);
      }),
    );
  });

  it('never gives a later segment the seed of another turn or sample of the group', () => {
    const turnSeeds = new Set<number>();
    for (let sample = 0; sample < 64; sample++) for (let turn = 0; turn < 32; turn++) turnSeeds.add(turnSeed(7, sample, turn));
    for (let sample = 0; sample < 64; sample++) {
      for (let turn = 0; turn < 32; turn++) for (let k = 1; k <= 8; k++) expect(turnSeeds.has(segmentSeed(7, sample, turn, k))).toBe(false);
    }
  });
});
