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
 *
 * {@link abortedTurnEnd} does the same for a segment that itself came back "abort": its tokens may already end the
 * turn (a stop token sampled, a stop string completed, by the step the abort raced), and such a turn is over — asked
 * again, the engine would sample on past the end of the turn.
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
  if (Math.max(...stops.map((s) => s.length)) <= 1) return undefined; // a one-character stop cannot span two segments
  return firstStopEnd(earlierIds, segmentIds, stops, decode, false);
}

/**
 * How many of an aborted segment's `segmentIds` an uninterrupted request would have returned when they already end
 * the turn: through its first stop token (an id of `stopTokenIds`: EOS, <|im_end|>, <|eot_id|>, ...), or through the
 * token completing a stop string that ends in this segment (begun in it or in the message's earlier segments),
 * whichever comes first; undefined when the turn goes on. The turn then ends there with finish "stop".
 */
export function abortedTurnEnd(
  earlierIds: readonly number[],
  segmentIds: readonly number[],
  stops: readonly string[],
  stopTokenIds: readonly number[],
  decode: (ids: readonly number[]) => string,
): number | undefined {
  const stopToken = firstStopToken(segmentIds, stopTokenIds);
  // Only text before the stop token counts: the engine would have ended at the token.
  const before = stopToken < 0 ? segmentIds : segmentIds.slice(0, stopToken);
  const byString = stops.length > 0 && before.length > 0 ? firstStopEnd(earlierIds, before, stops, decode, true) : undefined;
  return byString ?? (stopToken < 0 ? undefined : stopToken + 1);
}

/**
 * The fewest of `segmentIds` whose text completes the first stop string to end after the boundary (the end of
 * `earlierIds`' text): among those that start before it, or anywhere when `withinSegment`.
 */
function firstStopEnd(
  earlierIds: readonly number[],
  segmentIds: readonly number[],
  stops: readonly string[],
  decode: (ids: readonly number[]) => string,
  withinSegment: boolean,
): number | undefined {
  // A character split over the boundary decodes as U+FFFD at the end of the earlier text: that is not text yet.
  const earlier = earlierIds.length === 0 ? '' : decode(earlierIds).replace(/\uFFFD+$/u, '');
  const boundary = earlier.length;
  const textOf = (n: number): string => decode([...earlierIds, ...segmentIds.slice(0, n)]);
  const whole = textOf(segmentIds.length);
  // The first stop to complete (smallest end) among those that end after the boundary.
  let best: { start: number; end: number; stop: string } | undefined;
  for (const stop of stops) {
    if (stop.length === 0 || (!withinSegment && stop.length < 2)) continue;
    // The first occurrence ending after the boundary is this stop's earliest end (its length is fixed).
    const at = whole.indexOf(stop, Math.max(0, boundary - stop.length + 1));
    if (at < 0 || (!withinSegment && at >= boundary)) continue;
    const end = at + stop.length;
    if (best === undefined || end < best.end) best = { start: at, end, stop };
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

/** Index of the first id of `ids` that is one of `stopTokenIds`, -1 when none is. */
export function firstStopToken(ids: readonly number[], stopTokenIds: readonly number[]): number {
  for (let i = 0; i < ids.length; i++) if (stopTokenIds.includes(ids[i]!)) return i;
  return -1;
}
