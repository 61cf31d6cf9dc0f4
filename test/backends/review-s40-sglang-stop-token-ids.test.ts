import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SglangClient } from '../../src/backends/sglang-client.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';

// SGLang's `sampling_params.stop_token_ids` had been tested only against the SGLang double. What SGLang documents and
// does (docs/basic_usage/sampling_params: "stop_token_ids: Provide stop words in form of token ids. Generation will stop
// if one of these token ids is sampled", Optional[List[int]]; the behaviour below is read from its code, the same from
// v0.4.x through v0.5.x and main — sampling/sampling_params.py, managers/schedule_batch.py Req.check_finished,
// managers/detokenizer_manager.py trim_matched_stop):
// - the answer ends at the first of them sampled, that id kept in output_ids and output_token_logprobs;
// - meta_info.finish_reason is {type: "stop", matched: <the id, an int>};
// - the text leaves that token out unless no_stop_trim;
// - the length cap is tested first: a stop token sampled as the max_new_tokens-th token ends the answer
//   {type: "length", length: max_new_tokens}, the token kept and the text untrimmed. The double answered "stop" there
//   (it now answers as SGLang does; the agent loop already reads "length" on an end-of-turn token as a stop).
//
// TEST DOUBLE: FakeSglangEngine, a real HTTP server speaking SGLang's /generate (no real SGLang runs here); the engine
// client under test is the real SglangClient.

let tokenizer: Tokenizer;
let engine: FakeSglangEngine;
let prompt: number[];
let baseline: number[];
let stopAt: number;
let stopId: number;
let imEnd: number;

interface GenerateAnswer {
  text: string;
  output_ids: number[];
  meta_info: { finish_reason: Record<string, unknown>; output_token_logprobs: Array<[number, number, string | null]>; completion_tokens: number };
}

async function generate(sampling: Record<string, unknown>): Promise<GenerateAnswer> {
  const res = await fetch(`${engine.url}/generate`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ input_ids: prompt, sampling_params: { temperature: 0, sampling_seed: 7, skip_special_tokens: false, ...sampling }, return_logprob: true, logprob_start_len: -1, stream: false, rid: 'r' }),
  });
  expect(res.status).toBe(200);
  return (await res.json()) as GenerateAnswer;
}

const sampled = (a: GenerateAnswer): number[] => a.meta_info.output_token_logprobs.map((p) => p[1]);

beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
  engine = await FakeSglangEngine.start({ tokenizer, tokenLatencyMs: 0 });
  prompt = tokenizer.encode('<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n');
  imEnd = tokenizer.tokenId('<|im_end|>')!;
  baseline = sampled(await generate({ max_new_tokens: 256 }));
  expect(baseline.at(-1)).toBe(imEnd);
  // A token of the answer's middle, at its first occurrence, as the stop token.
  stopAt = baseline.findIndex((id, i) => i >= 3 && baseline.indexOf(id) === i && id !== imEnd);
  expect(stopAt).toBeGreaterThan(0);
  stopId = baseline[stopAt]!;
});
afterAll(async () => engine?.close());

describe('SGLang /generate with sampling_params.stop_token_ids (double reproducing SGLang)', () => {
  it('ends at the first of them sampled: the id kept as the last, finish_reason {type: stop, matched: id}, the text without it', async () => {
    const answer = await generate({ max_new_tokens: 256, stop_token_ids: [stopId] });
    expect(sampled(answer)).toEqual(baseline.slice(0, stopAt + 1));
    expect(answer.output_ids).toEqual(baseline.slice(0, stopAt + 1));
    expect(answer.meta_info.finish_reason).toEqual({ type: 'stop', matched: stopId });
    expect(answer.meta_info.completion_tokens).toBe(stopAt + 1);
    expect(answer.text).toBe(tokenizer.decode(baseline.slice(0, stopAt), { skipSpecialTokens: false }));
    const kept = await generate({ max_new_tokens: 256, stop_token_ids: [stopId], no_stop_trim: true });
    expect(kept.text).toBe(tokenizer.decode(baseline.slice(0, stopAt + 1), { skipSpecialTokens: false }));
  });

  it('tests the length cap first: a stop token sampled as the max_new_tokens-th token ends {type: length}, kept, the text untrimmed', async () => {
    const answer = await generate({ max_new_tokens: stopAt + 1, stop_token_ids: [stopId] });
    expect(sampled(answer)).toEqual(baseline.slice(0, stopAt + 1));
    expect(answer.meta_info.finish_reason).toEqual({ type: 'length', length: stopAt + 1 });
    expect(answer.text).toBe(tokenizer.decode(baseline.slice(0, stopAt + 1), { skipSpecialTokens: false }));
    // The same for the model's own end token (EOS: <|im_end|>) on the last allowed position.
    const eos = await generate({ max_new_tokens: baseline.length });
    expect(sampled(eos)).toEqual(baseline);
    expect(eos.meta_info.finish_reason).toEqual({ type: 'length', length: baseline.length });
    // One more token of room: the stop token ends it.
    expect((await generate({ max_new_tokens: stopAt + 2, stop_token_ids: [stopId] })).meta_info.finish_reason).toEqual({ type: 'stop', matched: stopId });
  });

  it('the real SglangClient sends stopTokenIds as sampling_params.stop_token_ids and reads both endings', async () => {
    const client = new SglangClient({ url: engine.url, model: engine.model });
    try {
      const stopped = await client.generate({ promptIds: prompt, maxTokens: 256, temperature: 0, seed: 7, stopTokenIds: [stopId], signal: AbortSignal.timeout(10_000) });
      expect((engine.lastRequest?.sampling_params as Record<string, unknown>).stop_token_ids).toEqual([stopId]);
      expect(stopped).toMatchObject({ tokenIds: baseline.slice(0, stopAt + 1), finishReason: 'stop' });
      const capped = await client.generate({ promptIds: prompt, maxTokens: stopAt + 1, temperature: 0, seed: 7, stopTokenIds: [stopId], signal: AbortSignal.timeout(10_000) });
      expect(capped).toMatchObject({ tokenIds: baseline.slice(0, stopAt + 1), finishReason: 'length' });
    } finally {
      client.close?.();
    }
  });
});
