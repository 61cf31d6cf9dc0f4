import { firstStopToken } from '../pipeline/continuation-stop.js';
import type { Tokenizer } from '../tokens/types.js';
import { hashInts } from './arithmetic.js';
import { policyContext, scriptedMathPolicy, type FakePolicy } from './scripted-policy.js';

/** What every fake engine needs to "sample": the canonical tokenizer, the policy and how its text becomes ids. */
export interface FakeSamplerOptions {
  tokenizer: Tokenizer;
  /** Produces the assistant text; defaults to `scriptedMathPolicy`. */
  policy?: FakePolicy;
  /** Turns the policy's text into ids (default: the canonical tokenizer); tests pass a non-canonical splitting. */
  tokenize?: (text: string) => number[];
}

/** One scripted completion, before any engine-specific shaping. */
export interface FakeSample {
  ids: number[];
  logprobs: number[];
  finish: 'stop' | 'length' | 'abort';
  /** The stop string that ended the text, or null (stop token, length or abort). */
  stopReason: string | null;
  /** The requested stop token id (vLLM/SGLang `stop_token_ids`) that ended the answer, if one did. */
  stopTokenId?: number;
}

/** Completions remembered for continuations (see FakeSampler); older ones are forgotten first. */
const MAX_REMEMBERED = 4096;

/**
 * TEST DOUBLE core shared by the fake vLLM and SGLang engines: runs the scripted policy on the decoded prompt,
 * cuts the text at the first stop string, tokenizes it, closes it with the stop token (<|im_end|>) unless a stop
 * string ended it, cuts at `maxTokens` (finish "length"), and gives each token a deterministic negative logprob
 * fixed by the seed, the position and the id — so two engines fed the same request sample the same tokens.
 *
 * Continuations: a real model given a prompt that ends inside an assistant message (an aborted request asked again
 * for the rest) continues that message. The scripted policy writes whole messages, so the sampler remembers what
 * it sampled for each prompt: a prompt that is an earlier prompt plus a proper prefix of its answer gets the rest
 * of that answer (no stop strings applied). A continuation it cannot match (sampled by another engine) gets the
 * policy's text for the prompt as it is.
 */
export class FakeSampler {
  readonly stopId: number;
  /** Full answers (before the max_tokens cut) by prompt, and the prompt lengths present, for continuations. */
  readonly #answers = new Map<string, number[]>();
  readonly #lengths = new Map<number, number>();

  constructor(private readonly options: FakeSamplerOptions) {
    const stopId = options.tokenizer.tokenId('<|im_end|>') ?? options.tokenizer.stopTokenIds[0];
    if (stopId === undefined) throw new Error('FakeSampler: the tokenizer has no stop token');
    this.stopId = stopId;
  }

  get tokenizer(): Tokenizer {
    return this.options.tokenizer;
  }

  /**
   * `stopTokenIds`: the request's stop token ids (vLLM's and SGLang's `stop_token_ids`): the answer ends at the first
   * of them sampled, that id kept as its last (finish "stop"), as the engines end it.
   */
  sample(promptIds: readonly number[], maxTokens: number, seed: number, stops: readonly string[], stopTokenIds: readonly number[] = []): FakeSample {
    const rest = this.#continuation(promptIds);
    if (rest !== undefined) {
      const ids = rest.slice(0, maxTokens);
      return { ids, logprobs: this.#logprobs(ids, seed, promptIds.length), finish: ids.length < rest.length ? 'length' : 'stop', stopReason: null };
    }
    const { tokenizer } = this.options;
    const text = (this.options.policy ?? scriptedMathPolicy)(tokenizer.decode(promptIds), policyContext(seed, promptIds));
    let stopReason: string | null = null;
    for (const stop of stops) {
      const at = text.indexOf(stop);
      if (stop !== '' && at >= 0 && (stopReason === null || at < text.indexOf(stopReason))) stopReason = stop;
    }
    const encode = (t: string): number[] => (this.options.tokenize ? this.options.tokenize(t) : tokenizer.encode(t));
    let ids: number[];
    if (stopReason === null) {
      ids = encode(text);
      ids.push(this.stopId);
    } else {
      // As vLLM does (v1/engine/detokenizer.py): the ids are every sampled one up to and including the token that
      // completes the stop string; only the text is cut before it.
      const end = text.indexOf(stopReason) + stopReason.length;
      ids = idsThrough(encode(text.slice(0, end + 16)), end, (prefix) => tokenizer.decode(prefix));
    }
    let stopTokenId: number | undefined;
    const stopAt = firstStopToken(ids, stopTokenIds);
    if (stopAt >= 0 && (stopAt < ids.length - 1 || stopReason !== null)) {
      ids = ids.slice(0, stopAt + 1);
      // The model's own end token (the double's eos) is reported as eos, as the engines do (stop_reason null).
      if (ids[stopAt] !== this.stopId) stopTokenId = ids[stopAt];
      stopReason = null;
    }
    this.#remember(promptIds, ids);
    let finish: FakeSample['finish'] = 'stop';
    if (ids.length > maxTokens) {
      ids = ids.slice(0, maxTokens);
      finish = 'length';
      stopReason = null;
      stopTokenId = undefined;
    }
    return { ids, logprobs: this.#logprobs(ids, seed, promptIds.length), finish, stopReason, ...(stopTokenId !== undefined && { stopTokenId }) };
  }

  #logprobs(ids: readonly number[], seed: number, at: number): number[] {
    return ids.map((id, i) => -(0.001 + (hashInts(seed, at + i, id) % 4000) / 1000));
  }

  #remember(promptIds: readonly number[], ids: readonly number[]): void {
    const key = prefixKeys(promptIds, promptIds.length, promptIds.length)[0]!;
    if (!this.#answers.has(key)) this.#lengths.set(promptIds.length, (this.#lengths.get(promptIds.length) ?? 0) + 1);
    this.#answers.set(key, [...ids]);
    if (this.#answers.size <= MAX_REMEMBERED) return;
    const oldest = this.#answers.keys().next().value!;
    this.#answers.delete(oldest);
    const length = Number(oldest.slice(0, oldest.indexOf(':')));
    const left = (this.#lengths.get(length) ?? 1) - 1;
    if (left > 0) this.#lengths.set(length, left);
    else this.#lengths.delete(length);
  }

  /**
   * The rest of a remembered answer when the prompt is its prompt plus a proper prefix of it; else undefined. Only
   * prompt lengths past the last <|im_start|> are tried (the answer's prompt ends with the assistant header), so a
   * fresh request costs a lookup or two.
   */
  #continuation(promptIds: readonly number[]): number[] | undefined {
    const imStart = this.options.tokenizer.tokenId('<|im_start|>');
    const from = imStart === undefined ? 0 : promptIds.lastIndexOf(imStart) + 1;
    let keys: string[] | undefined;
    for (let length = promptIds.length - 1; length >= from && length > 0; length--) {
      if (!this.#lengths.has(length)) continue;
      keys ??= prefixKeys(promptIds, from, promptIds.length - 1);
      const answer = this.#answers.get(keys[length - from]!);
      const partial = promptIds.length - length;
      if (answer === undefined || partial >= answer.length) continue;
      if (answer.slice(0, partial).every((id, i) => id === promptIds[length + i])) return answer.slice(partial);
    }
    return undefined;
  }
}

/**
 * Keys of the prompt's prefixes of `from` to `upTo` ids (keys[k] is the prefix of `from + k` ids): the length and two
 * 32-bit running hashes. Joining a 64K-id prompt into a string per request (what the key was) cost the engine double
 * milliseconds per request.
 */
function prefixKeys(ids: readonly number[], from: number, upTo: number): string[] {
  const keys = new Array<string>(upTo - from + 1);
  let a = 0x811c9dc5;
  let b = 0x9e3779b9;
  for (let i = 0; i <= upTo; i++) {
    if (i >= from) keys[i - from] = `${i}:${a >>> 0}:${b >>> 0}`;
    if (i === upTo) break;
    const id = ids[i]!;
    a = Math.imul(a ^ id, 0x01000193);
    b = Math.imul(b ^ (id + i), 0x5bd1e995) ^ (b >>> 15);
  }
  return keys;
}

/** The first `produced` tokens of a sample that was aborted (pause in abort mode, or an abort by id). */
export function abortedSample(sample: FakeSample, produced: number): FakeSample {
  return { ids: sample.ids.slice(0, produced), logprobs: sample.logprobs.slice(0, produced), finish: 'abort', stopReason: null };
}

/** The fewest leading ids of `ids` whose decoded text is at least `chars` long (a binary search over prefixes). */
function idsThrough(ids: readonly number[], chars: number, decode: (ids: readonly number[]) => string): number[] {
  let lo = 1;
  let hi = ids.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (decode(ids.slice(0, mid)).replace(/\uFFFD+$/u, '').length >= chars) hi = mid;
    else lo = mid + 1;
  }
  return ids.slice(0, lo);
}
