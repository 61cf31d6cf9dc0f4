import type { TokenIds } from './types.js';

/**
 * The JSON of a prompt's token ids, kept by whoever builds the prompt turn after turn.
 *
 * An engine request carries the whole context as ids (token-in): at 64K tokens, serializing them again for every
 * turn costs about a millisecond of event loop and a 400 KB string, although only the last turn's ids are new. The
 * token ledger therefore keeps its context serialized in pieces (one per append) and attaches them to the frozen
 * array it hands out; engine clients write those pieces into the request body (EngineHttp writes a body given in
 * pieces without joining them). An array without attached pieces is serialized as usual.
 *
 * Invariant: the attached pieces joined are exactly `JSON.stringify(ids)`; the array is handed out read-only and
 * never changed. (It is not frozen: V8 takes slow paths for frozen arrays, e.g. JSON.stringify 4x slower, spread
 * 1.2x, so freezing a 64K-id array costs milliseconds downstream.)
 */
const attached = new WeakMap<TokenIds, readonly JsonPiece[]>();

/**
 * A piece of JSON text: a string, or the text's bytes (ASCII: the JSON of ids has no other character). A long
 * prompt's JSON comes as bytes from the token thread that tokenized it (TokenTaskResult.idsJson, transferred, not
 * copied): as a string it was a 330 KB string deserialized on the event loop for a 64K-token prompt, then measured and
 * encoded again into every request body of the trajectory; as bytes it is copied into each body once.
 */
export type JsonPiece = string | Uint8Array;

/** Attaches the JSON of `ids` in pieces (joined, they must be `JSON.stringify(ids)`); `ids` must never change. */
export function attachIdsJson<T extends TokenIds>(ids: T, pieces: readonly JsonPiece[]): T {
  attached.set(ids, pieces);
  return ids;
}

/** The pieces attached to `ids`, if any (joined, they are `JSON.stringify(ids)`). */
export function attachedIdsJson(ids: TokenIds): readonly JsonPiece[] | undefined {
  return attached.get(ids);
}

/** `JSON.stringify(ids)` in pieces: the attached ones when there are. */
export function idsJson(ids: TokenIds): readonly JsonPiece[] {
  return attached.get(ids) ?? [JSON.stringify(Array.isArray(ids) ? ids : Array.from(ids))];
}

/** Pieces joined as one string (for tests and messages; request bodies are written from the pieces). */
export function piecesText(pieces: readonly JsonPiece[]): string {
  return pieces.map((p) => (typeof p === 'string' ? p : Buffer.from(p.buffer, p.byteOffset, p.byteLength).toString('latin1'))).join('');
}

/** A piece without its first and last character (a JSON array's brackets), without copying it. */
export function innerPiece(piece: JsonPiece): JsonPiece {
  return typeof piece === 'string' ? piece.slice(1, -1) : piece.subarray(1, piece.length - 1);
}

/**
 * A JSON object with `key` set to the ids (first) and then the fields of `rest` (which must not be empty and must
 * not hold `key`), in pieces: the request body, without serializing the ids again.
 */
export function bodyWithIds(key: string, ids: TokenIds, rest: Record<string, unknown>): JsonPiece[] {
  return [`{${JSON.stringify(key)}:`, ...idsJson(ids), `,${JSON.stringify(rest).slice(1)}`];
}
