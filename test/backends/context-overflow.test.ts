import { describe, expect, it } from 'vitest';
import { parseContextOverflow } from '../../src/backends/context-overflow.js';

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
