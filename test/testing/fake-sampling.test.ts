import { beforeAll, describe, expect, it } from 'vitest';
import { FakeSampler } from '../../src/testing/fake-sampling.js';
import { loadQwen3, type HfTokenizer } from '../../src/tokens/tokenizer.js';

let tokenizer: HfTokenizer;
beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
});

/** The TEST DOUBLE's sampler: what an engine asked again for the rest of an aborted answer gives. */
describe('FakeSampler continuations', () => {
  const policy = (text: string): string => `answer ${text.length} `.repeat(40);
  const promptOf = (text: string): number[] => tokenizer.encode(`<|im_start|>user\n${text}<|im_end|>\n<|im_start|>assistant\n`);

  it('gives the rest of a remembered answer to its prompt plus any proper prefix of it, at any length', () => {
    const sampler = new FakeSampler({ tokenizer, policy });
    const prompt = promptOf('hello');
    const whole = sampler.sample(prompt, 10_000, 7, []);
    expect(whole.ids.length).toBeGreaterThan(40);
    for (const cut of [1, 5, whole.ids.length - 1]) {
      const rest = sampler.sample([...prompt, ...whole.ids.slice(0, cut)], 10_000, 7, []);
      expect(rest.ids).toEqual(whole.ids.slice(cut));
    }
    // Cut by max_tokens: the rest is still the same answer's.
    expect(sampler.sample([...prompt, ...whole.ids.slice(0, 3)], 4, 7, []).ids).toEqual(whole.ids.slice(3, 7));
  });

  it('gives the policy text to a prompt that continues no remembered answer (another prompt, a diverging prefix)', () => {
    const sampler = new FakeSampler({ tokenizer, policy });
    const prompt = promptOf('hello');
    const whole = sampler.sample(prompt, 10_000, 7, []);
    const fresh = (ids: number[]): number[] => new FakeSampler({ tokenizer, policy }).sample(ids, 10_000, 7, []).ids;
    const other = [...promptOf('hellO'), ...whole.ids.slice(0, 3)];
    expect(sampler.sample(other, 10_000, 7, []).ids).toEqual(fresh(other));
    const diverging = [...prompt, ...whole.ids.slice(0, 2), whole.ids[2]! + 1];
    expect(sampler.sample(diverging, 10_000, 7, []).ids).toEqual(fresh(diverging));
  });
});
