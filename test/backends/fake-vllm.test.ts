import fc from 'fast-check';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { evaluateArithmetic, makeMathProblem, mathProblem } from '../../src/testing/arithmetic.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { createScriptedMathPolicy, policyContext } from '../../src/testing/scripted-policy.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { ChatMessage, ChatTemplate, Tokenizer, ToolSchema } from '../../src/tokens/types.js';

let tokenizer: Tokenizer;
let template: ChatTemplate;
let engine: FakeVllmEngine;
let client: VllmClient;

const tools: ToolSchema[] = [
  { type: 'function', function: { name: 'python', description: 'Runs Python', parameters: { type: 'object', properties: { code: { type: 'string' } } } } },
];

beforeAll(async () => {
  ({ tokenizer, template } = await loadQwen3());
  engine = await FakeVllmEngine.start({ tokenizer, policy: createScriptedMathPolicy({ wrongAnswerRate: 0, malformedToolCallRate: 0 }) });
  client = new VllmClient({ url: engine.url, model: engine.model });
});

afterAll(async () => {
  await engine?.close();
});

async function turn(messages: ChatMessage[], seed = 1, maxTokens = 200): Promise<string> {
  const promptIds = tokenizer.encode(template.render(messages, { addGenerationPrompt: true, tools }));
  const result = await client.generate({ promptIds, maxTokens, seed, signal: new AbortController().signal });
  return tokenizer.decode(result.tokenIds, { skipSpecialTokens: true });
}

describe('FakeVllmEngine with the scripted math policy', () => {
  const problem = mathProblem('17 * 23 + 5');
  const user: ChatMessage = { role: 'user', content: problem.question };

  it('calls the python tool with the problem on the first turn', async () => {
    const text = await turn([user]);
    expect(text).toBe('<tool_call>\n{"name": "python", "arguments": {"code": "print(17 * 23 + 5)"}}\n</tool_call>');
  });

  it('answers with the tool output after a tool response', async () => {
    const call = await turn([user]);
    const text = await turn([user, { role: 'assistant', content: call }, { role: 'tool', name: 'python', content: '396\n' }]);
    expect(text).toBe('The answer is \\boxed{396}.');
    expect(problem.answer).toBe(396);
  });

  it('retries the call after an error observation', async () => {
    const text = await turn([user, { role: 'assistant', content: '<tool_call>\n{oops\n</tool_call>' }, { role: 'tool', content: 'Error: invalid JSON' }]);
    expect(text).toContain('<tool_call>');
  });

  it('is deterministic per seed and varies across seeds with the default rates', () => {
    const policy = createScriptedMathPolicy();
    const prompt = template.render([user, { role: 'tool', content: '396' }], { addGenerationPrompt: true });
    const ids = tokenizer.encode(prompt);
    const answers = Array.from({ length: 60 }, (_, seed) => policy(prompt, policyContext(seed, ids)));
    expect(answers).toEqual(Array.from({ length: 60 }, (_, seed) => policy(prompt, policyContext(seed, ids))));
    expect(answers).toContain('The answer is \\boxed{396}.');
    expect(answers.some((a) => a !== 'The answer is \\boxed{396}.')).toBe(true);
    const calls = Array.from({ length: 60 }, (_, seed) => policy(template.render([user], { addGenerationPrompt: true }), policyContext(seed, [seed])));
    const malformed = calls.filter((c) => {
      try {
        JSON.parse(c.replace('<tool_call>', '').replace('</tool_call>', ''));
        return false;
      } catch {
        return true;
      }
    });
    expect(malformed.length).toBeGreaterThan(0);
    expect(malformed.length).toBeLessThan(60);
  });

  it('answers /v1/models and counts served requests', async () => {
    const before = engine.requestsServed;
    await turn([user]);
    expect(engine.requestsServed).toBe(before + 1);
    const models = (await (await fetch(`${engine.url}/v1/models`)).json()) as { object: string; data: Array<{ id: string; owned_by: string }> };
    expect(models.object).toBe('list');
    expect(models.data[0]).toMatchObject({ id: engine.model, object: 'model', owned_by: 'vllm' });
  });

  it('returns a vLLM-shaped completion', async () => {
    const promptIds = tokenizer.encode(template.render([user], { addGenerationPrompt: true }));
    const body = { model: engine.model, prompt: promptIds, max_tokens: 100, logprobs: 0, return_token_ids: true, seed: 5 };
    interface Choice {
      token_ids: number[];
      text: string;
      logprobs: { tokens: string[]; token_logprobs: number[]; top_logprobs: Array<Record<string, number>> };
    }
    const res = await fetch(`${engine.url}/v1/completions`, { method: 'POST', body: JSON.stringify(body) });
    const json = (await res.json()) as { choices: Choice[] };
    expect(json).toMatchObject({ object: 'text_completion', model: engine.model, usage: { prompt_tokens: promptIds.length } });
    const choice = json.choices[0]!;
    expect(choice).toMatchObject({ index: 0, finish_reason: 'stop', stop_reason: null, prompt_token_ids: promptIds });
    expect(choice.logprobs.tokens).toHaveLength(choice.token_ids.length);
    expect(choice.logprobs.top_logprobs[0]).toEqual({ [choice.logprobs.tokens[0]!]: choice.logprobs.token_logprobs[0] });
    expect(choice.text).not.toContain('<|im_end|>');
  });

  it('rejects a request for another model with 404, as vLLM does', async () => {
    const res = await fetch(`${engine.url}/v1/completions`, { method: 'POST', body: JSON.stringify({ model: 'other', prompt: [1] }) });
    expect(res.status).toBe(404);
  });
});

describe('FakeVllmEngine after a stop string, as vLLM 0.32 (v1/engine/detokenizer.py)', () => {
  it('returns the ids up to and including the token completing the stop string, and the text without it', async () => {
    const stopping = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 0, policy: () => 'The answer is <answer>42</answer> and more words after it.' });
    try {
      const c = new VllmClient({ url: stopping.url, model: stopping.model });
      const prompt = tokenizer.encode('<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n');
      const out = await c.generate({ promptIds: prompt, maxTokens: 64, stop: ['</answer>'], signal: new AbortController().signal });
      expect(out.finishReason).toBe('stop');
      expect(out.text).toBe('The answer is <answer>42');
      expect(tokenizer.decode(out.tokenIds)).toMatch(/<\/answer>$/u);
      expect(tokenizer.decode(out.tokenIds.slice(0, -1))).not.toContain('</answer>');
    } finally {
      await stopping.close();
    }
  });
});

describe('math problems', () => {
  it('evaluates what it generates, with the usual precedence', () => {
    expect(evaluateArithmetic('2 + 3 * (4 - 1)')).toBe(11);
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 1_000_000 }), (seed) => {
        const p = makeMathProblem(seed);
        const [a, op1, b, op2, c] = p.expression.split(' ');
        const apply = (x: number, op: string, y: number): number => (op === '+' ? x + y : op === '-' ? x - y : x * y);
        const expected = op2 === '*' ? apply(Number(a), op1!, Number(b) * Number(c)) : apply(apply(Number(a), op1!, Number(b)), op2!, Number(c));
        return p.answer === expected && p.question === `What is ${p.expression}?`;
      }),
    );
  });
});

describe("FakeVllmEngine's GET /server_info (a double of vLLM 0.32's dev-mode route)", () => {
  /** The real answer, recorded (see test/backends/server-info.test.ts). */
  const recorded = JSON.parse(readFileSync(new URL('../fixtures/vllm-0.32-server-info.json', import.meta.url), 'utf8')) as Record<string, Record<string, Record<string, unknown>>>;

  it('has the real shape: the same top-level keys, and the fields the server reads where vLLM puts them', async () => {
    const json = (await (await fetch(`${engine.url}/server_info?config_format=json`)).json()) as typeof recorded;
    expect(Object.keys(json).sort()).toEqual(Object.keys(recorded).sort());
    const read = [['model_config', 'logprobs_mode'], ['model_config', 'max_model_len'], ['scheduler_config', 'max_num_seqs'],
      ['parallel_config', 'data_parallel_size'], ['parallel_config', 'data_parallel_size_local'], ['parallel_config', 'data_parallel_external_lb'],
      ['parallel_config', 'data_parallel_hybrid_lb']] as const;
    for (const [section, field] of read) {
      expect(typeof json.vllm_config![section]![field], `${section}.${field}`).toBe(typeof recorded.vllm_config![section]![field]);
    }
    const text = (await (await fetch(`${engine.url}/server_info`)).json()) as { vllm_config: unknown };
    expect(typeof text.vllm_config).toBe('string'); // vLLM's default format: str(VllmConfig), without logprobs_mode
  });
});

describe("FakeVllmEngine's requestLatencyMs (a per-request decode time, as the soak's long tail)", () => {
  it('holds each request for the time it draws, spread over its tokens, so an abort still cuts it', async () => {
    const seen: Array<{ index: number; prompt: unknown }> = [];
    // The first request decodes for a minute (it is aborted); the second at once.
    const slow = await FakeVllmEngine.start({ tokenizer, requestLatencyMs: ({ index, body }) => (seen.push({ index, prompt: body.prompt }), index === 0 ? 60_000 : 0) });
    try {
      const promptIds = tokenizer.encode(template.render([{ role: 'user', content: 'What is 2 + 3?' }], { addGenerationPrompt: true }));
      const post = (requestId: string): Promise<{ choices: Array<{ finish_reason: string }> }> =>
        fetch(`${slow.url}/v1/completions`, { method: 'POST', headers: { 'x-request-id': requestId }, body: JSON.stringify({ model: slow.model, prompt: promptIds, max_tokens: 50, seed: 1 }) })
          .then((r) => r.json() as Promise<{ choices: Array<{ finish_reason: string }> }>);
      const held = post('held');
      await expect.poll(() => slow.inflightRequestIds()).toEqual(['cmpl-held-0']);
      expect((await post('quick')).choices[0]!.finish_reason).toBe('stop');
      await fetch(`${slow.url}/abort_requests`, { method: 'POST', body: JSON.stringify({ request_ids: ['cmpl-held-0'] }) });
      expect((await held).choices[0]!.finish_reason).toBe('abort');
      expect(seen).toEqual([{ index: 0, prompt: promptIds }, { index: 1, prompt: promptIds }]);
    } finally {
      await slow.close();
    }
  });
});
