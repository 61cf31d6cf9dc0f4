/**
 * The JSON of a prompt's token ids, kept by whoever builds the prompt turn after turn.
 *
 * An engine request carries the whole context as ids (token-in): at 64K tokens, serializing them again for every
 * turn costs milliseconds of event loop, although only the last turn's ids are new. The token ledger therefore keeps
 * the serialized context and attaches it to the (frozen) array it hands out; engine clients write that text into
 * the request body instead of serializing the ids again. An array without attached JSON is serialized as usual.
 *
 * Invariant: the attached text is exactly `JSON.stringify(ids)`, and the array is frozen, so it stays so.
 */
const attached = new WeakMap<readonly number[], string>();

/** Freezes `ids` and attaches its JSON (which must be `JSON.stringify(ids)`). */
export function attachIdsJson(ids: number[], json: string): readonly number[] {
  Object.freeze(ids);
  attached.set(ids, json);
  return ids;
}

/** `JSON.stringify(ids)`, from the attached text when there is one. */
export function idsJson(ids: readonly number[]): string {
  return attached.get(ids) ?? JSON.stringify(ids);
}

/**
 * A JSON object with `key` set to the ids (first) and then the fields of `rest` (which must not be empty and must
 * not hold `key`): the request body, without serializing the ids again.
 */
export function bodyWithIds(key: string, ids: readonly number[], rest: Record<string, unknown>): string {
  return `{${JSON.stringify(key)}:${idsJson(ids)},${JSON.stringify(rest).slice(1)}`;
}
