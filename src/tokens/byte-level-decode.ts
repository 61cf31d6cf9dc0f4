/**
 * Decoding for tokenizers whose decoder is `ByteLevel` (Qwen, Llama 3, DeepSeek): exactly what @huggingface/tokenizers'
 * `decode(ids, { clean_up_tokenization_spaces: false })` returns, without its per-call costs.
 *
 * The library maps ids to token strings, then for every token searches the added-token list by string (a linear
 * scan: 26 entries for Qwen3, 818 for DeepSeek-V3), joins each run of ordinary tokens into one string and maps it back
 * to bytes character by character through an object, then UTF-8-decodes the bytes. A 64K-token prompt took ~25 ms
 * (the fake engine decodes every prompt it is sent), a 19-token turn ~10 µs. Here every id's bytes are looked up in
 * one table built from tokenizer.json once, runs are copied into a scratch buffer and decoded with the same
 * `TextDecoder` settings (non-fatal, BOM kept); added tokens are written verbatim, special ones dropped when asked.
 *
 * The library's rules, kept exactly (test/tokens/byte-level-decode.property.test.ts compares both on random ids,
 * split multi-byte characters, added and special tokens and ids outside the vocabulary, for every ByteLevel family):
 * an id without a vocabulary entry stands for the model's unk_token (nothing when it has none); a token is written
 * verbatim when its string is an added token's content; skipping special tokens drops tokens whose string is a
 * special added token or one of the config's additional_special_tokens. A vocabulary this table cannot represent
 * (a token holding a character outside the byte alphabet, an end-of-word suffix) gets no fast decoder: the caller
 * uses the library.
 */
export class ByteLevelDecoder {
  /** Every id's bytes, concatenated: id k's are bytes[offsets[k]..offsets[k+1]). */
  readonly #bytes: Uint8Array;
  readonly #offsets: Int32Array;
  /** The strings of ids written as they are (added tokens). */
  readonly #verbatim: Map<number, string>;
  /** Per id: HOLE (no token: the vocabulary has no such id), BYTES (in `bytes`) or VERBATIM (in `verbatim`). */
  readonly #kind: Uint8Array;
  /** 1 for ids dropped when skipping special tokens. */
  readonly #special: Uint8Array;
  /** What an id outside the vocabulary stands for: the unk token's id, or -1 for nothing. */
  readonly #unk: number;
  readonly #decoder = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });
  #scratch = new Uint8Array(4096);

  private constructor(bytes: Uint8Array, offsets: Int32Array, verbatim: Map<number, string>, kind: Uint8Array, special: Uint8Array, unk: number) {
    this.#bytes = bytes;
    this.#offsets = offsets;
    this.#verbatim = verbatim;
    this.#kind = kind;
    this.#special = special;
    this.#unk = unk;
  }

  /** The decoder for this tokenizer.json, or undefined when its decoder is not plain ByteLevel (use the library). */
  static from(tokenizerJson: Record<string, unknown>, additionalSpecialTokens: readonly string[] = []): ByteLevelDecoder | undefined {
    const decoder = tokenizerJson.decoder as { type?: unknown } | null | undefined;
    const model = tokenizerJson.model as { type?: unknown; vocab?: unknown; unk_token?: unknown; end_of_word_suffix?: unknown } | undefined;
    if (decoder?.type !== 'ByteLevel' || model?.type !== 'BPE' || typeof model.vocab !== 'object' || model.vocab === null) return undefined;
    if (typeof model.end_of_word_suffix === 'string' && model.end_of_word_suffix !== '') return undefined;
    // The library's id -> token table: the model's vocabulary, then every added token's content at its id.
    const tokens: (string | undefined)[] = [];
    for (const [token, id] of Object.entries(model.vocab as Record<string, unknown>)) {
      if (!isId(id)) return undefined;
      tokens[id] = token;
    }
    const added = (Array.isArray(tokenizerJson.added_tokens) ? tokenizerJson.added_tokens : []) as { id?: unknown; content?: unknown; special?: unknown }[];
    const addedContents = new Set<string>();
    const specialContents = new Set(additionalSpecialTokens);
    for (const t of added) {
      if (!isId(t.id) || typeof t.content !== 'string') return undefined;
      tokens[t.id] = t.content;
      addedContents.add(t.content);
      if (t.special === true) specialContents.add(t.content);
    }
    const unkToken = typeof model.unk_token === 'string' ? model.unk_token : undefined;
    // One more entry at the end for the unk token's string (the library decodes the string, in the vocabulary or not).
    const unkId = unkToken === undefined ? -1 : tokens.length;
    const all = unkToken === undefined ? tokens : [...tokens, unkToken];
    const n = all.length;
    const offsets = new Int32Array(n + 1);
    // Sized by the tokens' total length (a character is one byte, or not representable); trimmed at the end.
    let total = 0;
    for (let id = 0; id < n; id++) total += all[id]?.length ?? 0;
    const chunks = new Uint8Array(total);
    let written = 0;
    const verbatim = new Map<number, string>();
    const special = new Uint8Array(n);
    const kind = new Uint8Array(n);
    for (let id = 0; id < n; id++) {
      offsets[id] = written;
      const token = all[id];
      if (token === undefined) continue;
      if (specialContents.has(token)) special[id] = 1;
      if (addedContents.has(token)) {
        kind[id] = VERBATIM;
        verbatim.set(id, token);
        continue;
      }
      kind[id] = BYTES;
      // Code units: a surrogate (a character outside the BMP) is outside the table, as it is outside the alphabet.
      for (let i = 0; i < token.length; i++) {
        const code = token.charCodeAt(i);
        const byte = code < UNICODE_TO_BYTE.length ? UNICODE_TO_BYTE[code]! : -1;
        if (byte < 0) return undefined;
        chunks[written++] = byte;
      }
    }
    offsets[n] = written;
    return new ByteLevelDecoder(chunks.slice(0, written), offsets, verbatim, kind, special, unkId);
  }

  /** The library's `decode(ids, { skip_special_tokens, clean_up_tokenization_spaces: false })`; [] is "". */
  decode(ids: readonly number[], skipSpecialTokens: boolean): string {
    const bytes = this.#bytes;
    const offsets = this.#offsets;
    const kind = this.#kind;
    const size = kind.length;
    let scratch = this.#scratch;
    let out = '';
    let length = 0;
    // An indexed loop: the ids come as arrays and as typed arrays, and for-of over both allocates an iterator result
    // per id wherever V8 does not optimise the loop.
    for (let k = 0; k < ids.length; k++) {
      const raw = ids[k]!;
      // An id without a token (outside the table, or a hole in it) stands for the unk token, or for nothing.
      const id = Number.isInteger(raw) && raw >= 0 && raw < size && kind[raw] !== HOLE ? raw : this.#unk;
      if (id < 0) continue;
      if (skipSpecialTokens && this.#special[id] === 1) continue;
      if (kind[id] === VERBATIM) {
        if (length > 0) out += this.#decoder.decode(scratch.subarray(0, length));
        length = 0;
        out += this.#verbatim.get(id)!;
        continue;
      }
      const from = offsets[id]!;
      const to = offsets[id + 1]!;
      if (length + to - from > scratch.length) {
        const grown = new Uint8Array(Math.max(2 * scratch.length, length + to - from));
        grown.set(scratch.subarray(0, length));
        this.#scratch = scratch = grown;
      }
      for (let i = from; i < to; i++) scratch[length++] = bytes[i]!;
    }
    if (length > 0) out += this.#decoder.decode(scratch.subarray(0, length));
    return out;
  }
}

const HOLE = 0;
const BYTES = 1;
const VERBATIM = 2;

function isId(value: unknown): value is number {
  return typeof value === 'number' && Number.isInteger(value) && value >= 0;
}

/** GPT-2's byte alphabet reversed: the character each byte is written as in a ByteLevel vocabulary, back to the byte. */
const UNICODE_TO_BYTE: Int16Array = (() => {
  const printable: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) printable.push(b);
  for (let b = 0xa1; b <= 0xac; b++) printable.push(b);
  for (let b = 0xae; b <= 0xff; b++) printable.push(b);
  // Indexed by the character's code (all below 256 + 68): its byte, or -1 outside the alphabet.
  const table = new Int16Array(512).fill(-1);
  for (const b of printable) table[b] = b;
  let next = 0;
  for (let b = 0; b < 256; b++) {
    if (!printable.includes(b)) table[256 + next++] = b;
  }
  return table;
})();
