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
}

/**
 * TEST DOUBLE core shared by the fake vLLM and SGLang engines: runs the scripted policy on the decoded prompt,
 * cuts the text at the first stop string, tokenizes it, closes it with the stop token (<|im_end|>) unless a stop
 * string ended it, cuts at `maxTokens` (finish "length"), and gives each token a deterministic negative logprob
 * fixed by the seed, the position and the id — so two engines fed the same request sample the same tokens.
 */
export class FakeSampler {
  readonly stopId: number;

  constructor(private readonly options: FakeSamplerOptions) {
    const stopId = options.tokenizer.tokenId('<|im_end|>') ?? options.tokenizer.stopTokenIds[0];
    if (stopId === undefined) throw new Error('FakeSampler: the tokenizer has no stop token');
    this.stopId = stopId;
  }

  get tokenizer(): Tokenizer {
    return this.options.tokenizer;
  }

  sample(promptIds: readonly number[], maxTokens: number, seed: number, stops: readonly string[]): FakeSample {
    const { tokenizer } = this.options;
    let text = (this.options.policy ?? scriptedMathPolicy)(tokenizer.decode([...promptIds]), policyContext(seed, promptIds));
    let stopReason: string | null = null;
    for (const stop of stops) {
      const at = text.indexOf(stop);
      if (stop !== '' && at >= 0 && (stopReason === null || at < text.indexOf(stopReason))) stopReason = stop;
    }
    if (stopReason !== null) text = text.slice(0, text.indexOf(stopReason));
    let ids = this.options.tokenize ? this.options.tokenize(text) : tokenizer.encode(text);
    if (stopReason === null) ids.push(this.stopId);
    let finish: FakeSample['finish'] = 'stop';
    if (ids.length > maxTokens) {
      ids = ids.slice(0, maxTokens);
      finish = 'length';
      stopReason = null;
    }
    const logprobs = ids.map((id, i) => -(0.001 + (hashInts(seed, promptIds.length + i, id) % 4000) / 1000));
    return { ids, logprobs, finish, stopReason };
  }
}

/** The first `produced` tokens of a sample that was aborted (pause in abort mode, or an abort by id). */
export function abortedSample(sample: FakeSample, produced: number): FakeSample {
  return { ids: sample.ids.slice(0, produced), logprobs: sample.logprobs.slice(0, produced), finish: 'abort', stopReason: null };
}
