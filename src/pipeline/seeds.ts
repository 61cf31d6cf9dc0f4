/** 2^53: seeds stay below it in magnitude, so every derived seed is an exact JS number and an exact JSON integer. */
const SAFE_SPAN = 2n ** 53n;

/**
 * The engine seed of one turn of one sample: samples of a GRPO group must differ, and so must a sample's turns,
 * while the whole run stays reproducible from the task's seed. Computed exactly (BigInt) and wrapped into
 * [0, 2^53) when the sum would leave the range of exact numbers — never rounded, so two different (sample,
 * turn) pairs near 2^53 cannot silently share a seed through float rounding.
 */
export function turnSeed(taskSeed: number, sampleIndex: number, turn: number): number {
  const seed = BigInt(taskSeed) + BigInt(sampleIndex) * 1_000n + BigInt(turn);
  if (seed < SAFE_SPAN && seed > -SAFE_SPAN) return Number(seed);
  return Number(((seed % SAFE_SPAN) + SAFE_SPAN) % SAFE_SPAN);
}
