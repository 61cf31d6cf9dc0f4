import { describe, expect, it } from 'vitest';
import { ContextOverflowError, parseContextOverflow, parseSglangContextOverflow } from '../../src/backends/context-overflow.js';
import { SglangClient } from '../../src/backends/sglang-client.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';

const body = (message: string): string => JSON.stringify({ error: { message, type: 'BadRequestError', param: null, code: 400 } });

describe("parseContextOverflow on vLLM's context-length refusals", () => {
  it("reads the limit and the prompt length from vLLM 0.32's 'your prompt contains' message", () => {
    const text = body(
      "This model's maximum context length is 1024 tokens. However, your prompt contains 1029 input tokens, which exceeds " +
        'this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=1029)',
    );
    expect(parseContextOverflow(400, text)).toEqual({ maxModelLen: 1024, promptTokens: 1029 });
  });

  it("recognises vLLM 0.32's 'max_tokens must be at least 1, got 0' as a prompt of exactly max_model_len, when the prompt length is known", () => {
    const text = body('max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)');
    expect(parseContextOverflow(400, text, 1024)).toEqual({ maxModelLen: 1024, promptTokens: 1024 });
    expect(parseContextOverflow(400, text)).toBeUndefined();
  });

  it('leaves other 400s alone', () => {
    expect(parseContextOverflow(400, body('max_tokens must be at least 1, got -3.'), 10)).toBeUndefined();
    expect(parseContextOverflow(400, body('temperature must be non-negative'), 10)).toBeUndefined();
    expect(parseContextOverflow(500, body("This model's maximum context length is 1024 tokens."), 10)).toBeUndefined();
  });
});

describe("parseSglangContextOverflow on SGLang's scheduler refusal (a prompt its token pool cannot take)", () => {
  it('reads validate_input_length\u2019s message as the limit max_req_len = the allowed input length + 5, with the prompt length', () => {
    const text = JSON.stringify({ error: { message: 'Input length (995 tokens) exceeds the maximum allowed length (993 tokens). Use a shorter input or enable --allow-auto-truncate.' } });
    expect(parseSglangContextOverflow(400, text)).toEqual({ maxModelLen: 998, promptTokens: 995, inputLimit: 993 });
    expect(parseSglangContextOverflow(500, text)).toBeUndefined();
  });

  it('an SGLang engine refuses such a prompt, and its client reports it as a context overflow (truncation), not a backend failure', async () => {
    const { tokenizer } = await loadQwen3();
    const prompt = tokenizer.encode('<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n');
    const engine = await FakeSglangEngine.start({ tokenizer, model: 'm', contextLength: 4096, maxTotalNumTokens: prompt.length + 4 });
    try {
      const err = await new SglangClient({ url: engine.url, model: 'm' }).generate({ promptIds: prompt, maxTokens: 8, signal: new AbortController().signal }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ContextOverflowError);
      expect(err).toMatchObject({ maxModelLen: prompt.length + 3, promptTokens: prompt.length });
    } finally {
      await engine.close();
    }
  });
});
