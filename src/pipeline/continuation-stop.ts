/**
 * Stop strings across a continued turn's segments.
 *
 * A turn whose request was aborted (an abort-mode pause for a weight update) goes on with a new request whose
 * prompt ends with what was sampled so far. Engines look for stop strings only in the text they generate for a
 * request (vLLM's and SGLang's detokenizers scan the new output), never across the prompt: a pause that cuts
 * "<answer>42</ans" leaves "wer>" to the continuation, which no engine matches against "</answer>", and the turn runs
 * on past a stop string the policy had already produced — a turn whose outcome depends on when a pause hit it.
 *
 * {@link stopAcrossBoundary} finds such a match over the whole message and says how many of the new segment's tokens
 * an uninterrupted request would have returned: up to and including the token that completes the stop string (the
 * engines return that token, and end with finish "stop"). The tokens after it are dropped — they are what the
 * engine sampled, but only because it missed the stop; the prefix kept is still exactly what it sampled.
 */

/**
 * How many of `segmentIds` to keep when a stop string starts in the message's earlier segments (`earlierIds`) and
 * ends in this one; undefined when none does. `decode` turns ids into text as the engine's detokenizer does
 * (special tokens kept: requests are sent with skip_special_tokens false).
 */
export function stopAcrossBoundary(
  earlierIds: readonly number[],
  segmentIds: readonly number[],
  stops: readonly string[],
  decode: (ids: readonly number[]) => string,
): number | undefined {
  if (stops.length === 0 || earlierIds.length === 0 || segmentIds.length === 0) return undefined;
  // A character split over the boundary decodes as U+FFFD at the end of the earlier text: that is not text yet.
  const earlier = decode(earlierIds).replace(/\uFFFD+$/u, '');
  const boundary = earlier.length;
  const longest = Math.max(...stops.map((s) => s.length));
  if (longest <= 1) return undefined; // a one-character stop cannot span two segments
  const textOf = (n: number): string => decode([...earlierIds, ...segmentIds.slice(0, n)]);
  const whole = textOf(segmentIds.length);
  // The first stop to complete (smallest end) among those that start before the boundary and end after it.
  let best: { start: number; end: number; stop: string } | undefined;
  for (const stop of stops) {
    if (stop.length < 2) continue;
    for (let from = Math.max(0, boundary - stop.length + 1); from < boundary; ) {
      const at = whole.indexOf(stop, from);
      if (at < 0 || at >= boundary) break;
      const end = at + stop.length;
      if (end > boundary && (best === undefined || end < best.end)) best = { start: at, end, stop };
      from = at + 1;
    }
  }
  if (best === undefined) return undefined;
  // The fewest tokens whose text holds that match (more tokens only add text after it): a binary search.
  const { start, stop } = best;
  let lo = 1;
  let hi = segmentIds.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (textOf(mid).startsWith(stop, start)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}
