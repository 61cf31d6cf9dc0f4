import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { checkCompletion, CompletionRejected, LOGPROB_TOLERANCE, tokenIdOf } from '../../src/backends/completion.js';

const VOCAB = 1000;

/** A vLLM completion answer as the engine sends it for `logprobs: 0, return_token_ids: true`. */
const honest = fc
  .record({
    maxTokens: fc.integer({ min: 1, max: 64 }),
    finish: fc.constantFrom('stop', 'length', 'abort'),
    text: fc.string(),
  })
  .chain(({ maxTokens, finish, text }) =>
    fc.record({
      maxTokens: fc.constant(maxTokens),
      finish: fc.constant(finish),
      text: fc.constant(text),
      // Every step samples a token: only an abort may come back with none.
      ids: fc.array(fc.integer({ min: 0, max: VOCAB - 1 }), { minLength: finish === 'abort' ? 0 : 1, maxLength: maxTokens }),
      // vLLM states the count in usage.completion_tokens; an answer without usage is read by its lists alone.
      usage: fc.boolean(),
    }),
  )
  .chain((a) =>
    fc.record({
      ...Object.fromEntries(Object.entries(a).map(([k, v]) => [k, fc.constant(v)])),
      logprobs: fc.array(fc.double({ min: -30, max: LOGPROB_TOLERANCE, noNaN: true }), { minLength: a.ids.length, maxLength: a.ids.length }),
    }) as fc.Arbitrary<typeof a & { logprobs: number[] }>,
  );

interface Answer {
  ids: unknown[];
  logprobs: unknown[];
  finish: unknown;
  text: unknown;
  usage: boolean;
  /** usage.completion_tokens when it is not the ids' count (a corruption). */
  completionTokens?: unknown;
}

function body(a: Answer): Record<string, unknown> {
  return {
    id: 'cmpl-1',
    object: 'text_completion',
    choices: [{ index: 0, text: a.text, token_ids: a.ids, logprobs: { token_logprobs: a.logprobs }, finish_reason: a.finish, stop_reason: null }],
    ...(a.usage && { usage: { prompt_tokens: 3, completion_tokens: 'completionTokens' in a ? a.completionTokens : a.ids.length } }),
  };
}

type Corruption = (a: Answer & { maxTokens: number }, at: number) => string;

/** Ways an engine answer can be wrong, each with the words the rejection must say. */
const corruptions: Record<string, Corruption> = {
  'id out of vocabulary': (a, at) => ((a.ids[at] = VOCAB + at), 'is not an integer in [0, 1000)'),
  'negative id': (a, at) => ((a.ids[at] = -1), 'is not an integer'),
  'fractional id': (a, at) => ((a.ids[at] = 1.5), 'is not an integer'),
  'id as a string': (a, at) => ((a.ids[at] = '7'), 'is not an integer'),
  'positive logprob': (a, at) => ((a.logprobs[at] = 3.5), 'is positive'),
  'null logprob': (a, at) => ((a.logprobs[at] = null), 'is not a finite number'),
  'missing logprob': (a) => (a.logprobs.pop(), 'logprobs'),
  'extra logprob': (a) => (a.logprobs.push(-0.1), 'logprobs'),
  'more tokens than max_tokens': (a) => {
    while (a.ids.length <= a.maxTokens) {
      a.ids.push(1);
      a.logprobs.push(-0.5);
    }
    return `for max_tokens ${a.maxTokens}`;
  },
  'unknown finish_reason': (a) => ((a.finish = 'tool_calls'), 'finish_reason'),
  'text not a string': (a) => ((a.text = { nested: [1, 2] }), 'text'),
  // Regression: an answer with no token but finish stop/length became a COMPLETED reward-0 (or TRUNCATED) trajectory.
  'no token, not an abort': (a) => {
    a.ids.length = 0;
    a.logprobs.length = 0;
    if (a.finish === 'abort') a.finish = 'stop';
    return 'no sampled token with finish_reason';
  },
  // Regression: lists that lost entries (usage still counting them) silently dropped sampled tokens.
  'usage.completion_tokens disagrees': (a, at) => {
    a.usage = true;
    a.completionTokens = a.ids.length + 1 + at;
    return `usage.completion_tokens = ${a.ids.length + 1 + at}, but the answer holds ${a.ids.length} sampled token ids`;
  },
};

describe('checkCompletion, the one check of an engine answer', () => {
  it('returns exactly the ids, logprobs, finish reason and text of any honest answer', () => {
    fc.assert(
      fc.property(honest, (a) => {
        const out = checkCompletion(body(a), { maxTokens: a.maxTokens, vocabSize: VOCAB });
        expect(out).toEqual({ tokenIds: a.ids, logprobs: a.logprobs, finishReason: a.finish, text: a.text });
      }),
    );
  });

  it('refuses every answer with one corrupted field, saying what is wrong', () => {
    const nonEmpty = honest.filter((a) => a.ids.length > 0);
    fc.assert(
      fc.property(nonEmpty, fc.constantFrom(...Object.keys(corruptions)), fc.nat(), (a, kind, n) => {
        const bad = { ...a, ids: [...a.ids] as unknown[], logprobs: [...a.logprobs] as unknown[] };
        const words = corruptions[kind]!(bad, n % a.ids.length);
        let thrown: unknown;
        try {
          checkCompletion(body(bad), { maxTokens: a.maxTokens, vocabSize: VOCAB });
        } catch (err) {
          thrown = err;
        }
        expect(thrown, kind).toBeInstanceOf(CompletionRejected);
        expect((thrown as CompletionRejected).reason, kind).toContain(words);
      }),
    );
  });

  it('refuses shapes that are not a completion at all', () => {
    for (const json of [null, [], 'text', { choices: [] }, { choices: [null] }, { choices: [{ token_ids: [1] }] }, { choices: [{ token_ids: [[[1]]], logprobs: { token_logprobs: [-1] } }] }]) {
      expect(() => checkCompletion(json, { maxTokens: 8, vocabSize: VOCAB }), JSON.stringify(json)).toThrow(CompletionRejected);
    }
  });
});

describe('reading vLLM\'s "token_id:<id>" tokens', () => {
  /** The rule as a regex (what the reader replaced): decimal, at most 16 digits, no leading zero but "0". */
  const reference = (token: unknown): number => {
    const match = typeof token === 'string' ? /^token_id:(0|[1-9][0-9]{0,15})$/.exec(token) : null;
    return match === null ? -1 : Number(match[1]);
  };

  it('reads exactly the tokens the rule allows, and their ids', () => {
    const digits = fc.string({ unit: fc.constantFrom('0', '1', '7', '9', 'a', ' ', '-', '\u0660'), maxLength: 18 });
    const token = fc.oneof(
      digits.map((d) => `token_id:${d}`),
      fc.nat().map((n) => `token_id:${n}`),
      fc.bigInt({ min: 0n, max: 10n ** 17n }).map((n) => `token_id:${n}`),
      fc.string().map((s) => `token_id:${s}`),
      fc.string(),
      fc.constantFrom('token_id:', 'token_id:0', 'token_id:00', 'token_id:01', 'token_id:9999999999999999', 'token_id:10000000000000000', 'Token_id:1', ' token_id:1', 'token_id:1 ', 'token_id:+1'),
      fc.anything(),
    );
    fc.assert(
      fc.property(token, (t) => {
        expect(tokenIdOf(t)).toBe(reference(t));
      }),
      { numRuns: 5000 },
    );
  });
});
