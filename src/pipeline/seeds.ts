/** 2^53: seeds stay below it in magnitude, so every derived seed is an exact JS number and an exact JSON integer. */
const SAFE_SPAN = 2n ** 53n;

/**
 * The engine seed of one turn of one sample: samples of a GRPO group must differ, and so must a sample's turns,
 * while the whole run stays reproducible from the task's seed. Computed exactly (BigInt) and wrapped into
 * [0, 2^53) when the sum would leave the range of exact numbers — never rounded, so two different (sample,
 * turn) pairs near 2^53 cannot silently share a seed through float rounding.
 */
export function turnSeed(taskSeed: number, sampleIndex: number, turn: number): number {
  return exact(BigInt(taskSeed) + BigInt(sampleIndex) * 1_000n + BigInt(turn));
}

/**
 * Offset between the seeds of a turn's segments: larger than any (sample, turn) offset of {@link turnSeed} (1000 ×
 * sample + turn, below 10^9 for any group size the server accepts), prime, and not a multiple of 2^32, so segment
 * seeds stay distinct when an engine keeps only the low 32 bits (llama.cpp).
 */
const SEGMENT_STRIDE = 1_000_000_007n;

/**
 * The engine seed of segment `segment` of a turn. A turn whose request was aborted (a pause for a weight update)
 * is asked again for the rest, as segment 1, 2, ...: reusing the turn's seed would replay the random stream that
 * drew the first segment's tokens for the next ones, so each segment gets its own seed, deterministically:
 * turnSeed + segment × 1,000,000,007, wrapped into [0, 2^53) like turnSeed. Segment 0 is turnSeed itself, so a
 * turn that was never interrupted is seeded exactly as before.
 */
export function segmentSeed(taskSeed: number, sampleIndex: number, turn: number, segment: number): number {
  return exact(BigInt(turnSeed(taskSeed, sampleIndex, turn)) + BigInt(segment) * SEGMENT_STRIDE);
}

/** The seed as an exact number: itself while within ±2^53, otherwise wrapped into [0, 2^53), never rounded. */
function exact(seed: bigint): number {
  if (seed < SAFE_SPAN && seed > -SAFE_SPAN) return Number(seed);
  return Number(((seed % SAFE_SPAN) + SAFE_SPAN) % SAFE_SPAN);
}
