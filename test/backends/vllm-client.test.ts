import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { abortReason } from '../../src/errors.js';
import { MAX_ERROR_BODY_BYTES, VllmClient, VllmHttpError } from '../../src/backends/vllm-client.js';
import { ContextOverflowError } from '../../src/backends/context-overflow.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';
import { expectRolloutError, rawServer } from '../support/engine-client-support.js';

let tokenizer: Tokenizer;
let engine: FakeVllmEngine;
let client: VllmClient;
let prompt: number[];

beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
  engine = await FakeVllmEngine.start({ tokenizer, model: 'qwen3-test' });
  // Generous: this suite shares 2 cores with the real vLLM's suite in CI; only the 'impatient' client tests timeouts.
  client = new VllmClient({ url: engine.url, model: 'qwen3-test', requestTimeoutMs: 60_000 });
  prompt = tokenizer.encode('<|im_start|>user\nWhat is 17 * 23 + 5?<|im_end|>\n<|im_start|>assistant\n');
});

afterAll(async () => {
  await engine?.close();
});

const signal = (): AbortSignal => new AbortController().signal;

describe('VllmClient against the fake vLLM engine', () => {
  it('sends the token-id prompt with vLLM token-in/token-out parameters', async () => {
    await client.generate({ promptIds: prompt, maxTokens: 64, temperature: 0.7, topP: 0.9, topK: 20, seed: 7, stop: ['</answer>'], signal: signal() });
    expect(engine.lastRequest).toMatchObject({
      model: 'qwen3-test',
      prompt,
      max_tokens: 64,
      temperature: 0.7,
      top_p: 0.9,
      top_k: 20,
      seed: 7,
      stop: ['</answer>'],
      logprobs: 0,
      return_tokens_as_token_ids: true,
      skip_special_tokens: false,
    });
    // return_token_ids would make vLLM echo every prompt id into the answer.
    expect(engine.lastRequest).not.toHaveProperty('return_token_ids');
  });

  it('sends every sampling field, the unset ones neutral: vLLM would fill them from the model\u2019s generation_config.json', async () => {
    await client.generate({ promptIds: prompt, maxTokens: 8, signal: signal() });
    expect(engine.lastRequest).toMatchObject({ temperature: 1, top_p: 1, top_k: -1, min_p: 0, repetition_penalty: 1, presence_penalty: 0, frequency_penalty: 0 });
  });

  it('returns token ids and logprobs exactly as the engine sent them', async () => {
    const result = await client.generate({ promptIds: prompt, maxTokens: 256, seed: 3, signal: signal() });
    const raw = (await (
      await fetch(`${engine.url}/v1/completions`, { method: 'POST', body: JSON.stringify({ ...engine.lastRequest, return_token_ids: true }) })
    ).json()) as { choices: Array<{ token_ids: number[]; logprobs: { token_logprobs: number[] } }> };
    expect(result.tokenIds).toEqual(raw.choices[0]!.token_ids);
    expect(result.logprobs).toEqual(raw.choices[0]!.logprobs.token_logprobs);
    expect(result.finishReason).toBe('stop');
    expect(result.tokenIds.at(-1)).toBe(tokenizer.tokenId('<|im_end|>'));
    expect(result.logprobs.every((x) => x < 0)).toBe(true);
  });

  it('reports finish "length" when max_tokens cuts the answer', async () => {
    const result = await client.generate({ promptIds: prompt, maxTokens: 5, seed: 1, signal: signal() });
    expect(result.finishReason).toBe('length');
    expect(result.tokenIds).toHaveLength(5);
    expect(result.logprobs).toHaveLength(5);
  });

  it('turns an HTTP 500 into backend_error with the status in the cause', async () => {
    engine.failNext(1);
    const err = await expectRolloutError(client.generate({ promptIds: prompt, maxTokens: 8, signal: signal() }), 'backend_error');
    expect(err.cause).toBeInstanceOf(VllmHttpError);
    expect((err.cause as VllmHttpError).status).toBe(500);
  });

  it('turns a dropped connection into backend_error', async () => {
    engine.failNext(1, { kind: 'drop' });
    await expectRolloutError(client.generate({ promptIds: prompt, maxTokens: 8, signal: signal() }), 'backend_error');
  });

  it('turns a refused connection into backend_error', async () => {
    const { url, server } = await rawServer({});
    await new Promise((resolve) => server.close(resolve));
    const dead = new VllmClient({ url, model: 'm' });
    const err = await expectRolloutError(dead.generate({ promptIds: [1], maxTokens: 1, signal: signal() }), 'backend_error');
    expect(err.message).toContain('ECONNREFUSED');
  });

  it('keeps the meaning of an abort: cancelled, or deadline_exceeded for a deadline', async () => {
    engine.failNext(2, { kind: 'hang' });
    const cancel = new AbortController();
    const cancelled = client.generate({ promptIds: prompt, maxTokens: 8, signal: cancel.signal });
    setTimeout(() => cancel.abort(), 20);
    await expectRolloutError(cancelled, 'cancelled');
    const deadline = new AbortController();
    const late = client.generate({ promptIds: prompt, maxTokens: 8, signal: deadline.signal });
    setTimeout(() => deadline.abort(abortReason('deadline_exceeded', 'turn deadline')), 20);
    await expectRolloutError(late, 'deadline_exceeded');
  });

  it('fails a request that outlives its timeout with backend_error', async () => {
    engine.failNext(1, { kind: 'hang' });
    const impatient = new VllmClient({ url: engine.url, model: 'qwen3-test', requestTimeoutMs: 50 });
    const err = await expectRolloutError(impatient.generate({ promptIds: prompt, maxTokens: 8, signal: signal() }), 'backend_error');
    expect(err.message).toContain('did not answer within 50 ms');
  });

  it('rejects an answer whose token ids and logprobs differ in length', async () => {
    const { url, server } = await rawServer({
      choices: [{ index: 0, text: 'ab', token_ids: [1, 2], logprobs: { token_logprobs: [-0.1] }, finish_reason: 'stop' }],
    });
    try {
      const bad = new VllmClient({ url, model: 'm' });
      const err = await expectRolloutError(bad.generate({ promptIds: [1], maxTokens: 2, signal: signal() }), 'backend_error');
      expect(err.message).toContain('2 token ids but 1 logprobs');
    } finally {
      server.close();
    }
  });

  it('rejects an answer with neither token_ids nor "token_id:<id>" tokens (an engine without return_tokens_as_token_ids)', async () => {
    for (const logprobs of [{ token_logprobs: [-0.1] }, { token_logprobs: [-0.1], tokens: ['a'] }, { token_logprobs: [-0.1], tokens: ['token_id:07'] }]) {
      const { url, server } = await rawServer({ choices: [{ index: 0, text: 'a', logprobs, finish_reason: 'stop' }] });
      try {
        const old = new VllmClient({ url, model: 'm' });
        await expectRolloutError(old.generate({ promptIds: [1], maxTokens: 2, signal: signal() }), 'backend_error');
      } finally {
        server.close();
      }
    }
  });

  it('reads the sampled ids from "token_id:<id>" tokens verbatim', async () => {
    const { url, server } = await rawServer({
      choices: [{ index: 0, text: 'ab', logprobs: { token_logprobs: [-0.5, 0], tokens: ['token_id:0', 'token_id:151668'] }, finish_reason: 'length' }],
    });
    try {
      const c = new VllmClient({ url, model: 'm' });
      const result = await c.generate({ promptIds: [1], maxTokens: 2, vocabSize: 151_669, signal: signal() });
      expect(result).toEqual({ tokenIds: [0, 151_668], logprobs: [-0.5, 0], finishReason: 'length', text: 'ab' });
    } finally {
      server.close();
    }
  });

  it('reports health from GET /health', async () => {
    expect(await client.health(signal())).toBe(true);
    engine.setHealthy(false);
    expect(await client.health(signal())).toBe(false);
    engine.setHealthy(true);
    const dead = new VllmClient({ url: 'http://127.0.0.1:1', model: 'm' });
    expect(await dead.health(AbortSignal.timeout(1_000))).toBe(false);
  });

  it('reads the served model\'s max_model_len from GET /v1/models', async () => {
    const small = await FakeVllmEngine.start({ tokenizer, model: 'qwen3-test', maxModelLen: 3072 });
    try {
      expect(await new VllmClient({ url: small.url, model: 'qwen3-test' }).modelInfo(signal())).toEqual({ maxModelLen: 3072 });
      small.setModelsListed(false);
      await expectRolloutError(new VllmClient({ url: small.url, model: 'qwen3-test' }).modelInfo(signal()), 'backend_error');
    } finally {
      await small.close();
    }
  });
});

describe('VllmClient asks the engine how it runs (GET /server_info, dev mode)', () => {
  it('reads the logprobs mode and max_num_seqs; a production vLLM (404) and a broken route (500) say nothing', async () => {
    const raw = await FakeVllmEngine.start({ tokenizer, model: 'qwen3-test', logprobsMode: 'raw_logprobs', maxNumSeqs: 48 });
    const production = await FakeVllmEngine.start({ tokenizer, model: 'qwen3-test', devMode: false });
    const broken = await rawServer({ error: { message: "'NoneType' object has no attribute 'splitlines'", code: 500 } }, 500);
    try {
      expect(await client.serverInfo(signal())).toEqual({ logprobsMode: 'processed', maxConcurrency: 256 });
      expect(await new VllmClient({ url: raw.url, model: 'qwen3-test' }).serverInfo(signal())).toEqual({ logprobsMode: 'raw', maxConcurrency: 48 });
      const silent = await new VllmClient({ url: production.url, model: 'qwen3-test' }).serverInfo(signal());
      expect(silent).toEqual({ note: expect.stringContaining('VLLM_SERVER_DEV_MODE=1') as unknown });
      expect((await new VllmClient({ url: broken.url, model: 'm' }).serverInfo(signal())).note).toMatch(/HTTP 500.*splitlines/);
      await expectRolloutError(new VllmClient({ url: 'http://127.0.0.1:1', model: 'm' }).serverInfo(AbortSignal.timeout(1_000)), 'backend_error');
    } finally {
      broken.server.close();
      await Promise.all([raw.close(), production.close()]);
    }
  });
});

describe('VllmClient checks every engine answer before it becomes a trajectory', () => {
  const ask = (c: VllmClient, extra: { maxTokens?: number; vocabSize?: number } = {}) =>
    c.generate({ promptIds: prompt, maxTokens: extra.maxTokens ?? 64, vocabSize: extra.vocabSize ?? 151_669, seed: 5, signal: signal() });

  it('refuses token ids outside the tokenizer\'s vocabulary', async () => {
    engine.failNext(1, { kind: 'tamper', tamper: (choice) => ((choice.logprobs as { tokens: string[] }).tokens[1] = 'token_id:9999999') });
    const err = await expectRolloutError(ask(client), 'backend_error');
    expect(err.message).toContain('logprobs.tokens[1] (token_id) = 9999999 is not an integer in [0, 151669)');
  });

  it('refuses an answer with more tokens than max_tokens asked for', async () => {
    engine.failNext(1, {
      kind: 'tamper',
      tamper: (choice) => {
        (choice.logprobs as { tokens: string[] }).tokens = Array.from({ length: 200_000 }, (_, i) => `token_id:${i % 1000}`);
        (choice.logprobs as { token_logprobs: number[] }).token_logprobs = Array.from({ length: 200_000 }, () => -0.5);
      },
    });
    const err = await expectRolloutError(ask(client, { maxTokens: 64 }), 'backend_error');
    expect(err.message).toMatch(/200000 token ids for max_tokens 64|larger than the \d+-byte cap/);
  });

  it('refuses positive logprobs (+3.5) and NaN, which JSON cannot even carry', async () => {
    engine.failNext(1, { kind: 'tamper', tamper: (choice) => ((choice.logprobs as { token_logprobs: number[] }).token_logprobs[0] = 3.5) });
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain('token_logprobs[0] = 3.5 is positive');
    const nan = await rawServer('{"choices":[{"text":"a","token_ids":[1],"logprobs":{"token_logprobs":[NaN]},"finish_reason":"stop"}]}');
    try {
      const err = await expectRolloutError(ask(new VllmClient({ url: nan.url, model: 'm' })), 'backend_error');
      expect(err.message).toContain('body is not JSON');
    } finally {
      nan.server.close();
    }
  });

  // Regression: only an upper bound was checked: lists missing entries dropped sampled tokens, no token at all was COMPLETED.
  it('refuses a token count that cannot be right: no token unless aborted, fewer than usage.completion_tokens, lists that disagree', async () => {
    const drop = (keep: (list: unknown[]) => unknown[]) => (choice: Record<string, unknown>) => {
      const lp = choice.logprobs as Record<string, unknown[]>;
      for (const key of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) lp[key] = keep(lp[key]!);
    };
    engine.failNext(1, { kind: 'tamper', tamper: drop((list) => list.slice(3)) });
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toMatch(/usage\.completion_tokens = (\d+), but the answer holds \d+ sampled token ids/);
    for (const finish of ['stop', 'length']) {
      engine.failNext(1, { kind: 'tamper', tamper: (choice) => (drop(() => [])(choice), (choice.finish_reason = finish), (choice.text = '')) });
      expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain(`no sampled token with finish_reason "${finish}"`);
    }
    const bodies: Array<[Record<string, unknown>, string | undefined]> = [
      // An abort before the first token is the one answer with none.
      [{ text: '', logprobs: { token_logprobs: [], tokens: [] }, finish_reason: 'abort' }, undefined],
      [{ text: 'ab', token_ids: [5, 6], logprobs: { token_logprobs: [-0.1, -0.2], tokens: ['token_id:5', 'token_id:7'] }, finish_reason: 'stop' }, 'logprobs.tokens[1] = "token_id:7" but token_ids[1] = 6'],
      [{ text: 'ab', token_ids: [5, 6], logprobs: { token_logprobs: [-0.1, -0.2], tokens: ['token_id:6'] }, finish_reason: 'stop' }, '2 token_ids but 1 logprobs.tokens'],
    ];
    for (const [choice, refusal] of bodies) {
      const { url, server } = await rawServer({ choices: [{ index: 0, ...choice }], usage: { prompt_tokens: 1, completion_tokens: (choice.token_ids as unknown[] | undefined)?.length ?? 0 } });
      try {
        const c = new VllmClient({ url, model: 'm' });
        if (refusal === undefined) expect((await ask(c)).tokenIds).toEqual([]);
        else expect((await expectRolloutError(ask(c), 'backend_error')).message).toContain(refusal);
      } finally {
        server.close();
      }
    }
  });

  it('refuses a text that is not a string', async () => {
    engine.failNext(1, { kind: 'tamper', tamper: (choice) => (choice.text = ['not', 'text']) });
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain('text is an array, not a string');
  });

  it('survives an answer nested a million levels deep: refused where it matters, dropped where it does not', async () => {
    const deep = `${'['.repeat(1_000_000)}${']'.repeat(1_000_000)}`;
    const inIds = await rawServer(`{"choices":[{"text":"","token_ids":${deep},"logprobs":{"token_logprobs":[]},"finish_reason":"stop"}]}`);
    const aside = await rawServer(`{"junk":${deep},"choices":[{"text":"a","token_ids":[7],"logprobs":{"token_logprobs":[-0.1]},"finish_reason":"stop"}]}`);
    try {
      const big = { maxResponseBytes: 4 << 20 };
      await expectRolloutError(ask(new VllmClient({ url: inIds.url, model: 'm', ...big })), 'backend_error');
      const out = await ask(new VllmClient({ url: aside.url, model: 'm', ...big }));
      expect(out).toEqual({ tokenIds: [7], logprobs: [-0.1], finishReason: 'stop', text: 'a' });
      expect(() => JSON.stringify(out)).not.toThrow();
    } finally {
      inIds.server.close();
      aside.server.close();
    }
  });

  it('stops reading an answer as soon as it passes the byte cap and drops the connection', async () => {
    const capped = new VllmClient({ url: engine.url, model: 'qwen3-test', maxResponseBytes: 256 * 1024 });
    const before = engine.stats().oversizedBytesSent;
    engine.failNext(1, { kind: 'oversized', bytes: 256 << 20 });
    const err = await expectRolloutError(ask(capped), 'backend_error');
    expect(err.message).toContain('larger than the 262144-byte cap');
    // The engine could only push what the socket buffers held before the client hung up, not 256 MiB.
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(engine.stats().oversizedBytesSent - before).toBeLessThan(32 << 20);
    // The client is still good for the next request.
    expect((await ask(capped)).finishReason).toBe('stop');
  });

  it('a 600 MiB answer is refused under the default cap without ever being held (no ERR_STRING_TOO_LONG)', async () => {
    const before = engine.stats().oversizedBytesSent;
    engine.failNext(1, { kind: 'oversized', bytes: 600 << 20 });
    const err = await expectRolloutError(ask(client, { maxTokens: 256 }), 'backend_error');
    expect(err.message).toMatch(/larger than the \d+-byte cap/);
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(engine.stats().oversizedBytesSent - before).toBeLessThan(32 << 20);
  });

  it('refuses an answer whose content-length is over the cap before reading it', async () => {
    const huge = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(700 << 20) });
      res.write('{"choices":');
    });
    await new Promise<void>((resolve) => huge.listen(0, '127.0.0.1', resolve));
    try {
      const url = `http://127.0.0.1:${(huge.address() as AddressInfo).port}`;
      const err = await expectRolloutError(ask(new VllmClient({ url, model: 'm' })), 'backend_error');
      expect(err.message).toContain(`content-length ${700 << 20}`);
    } finally {
      huge.closeAllConnections();
      huge.close();
    }
  });

  it('keeps at most 64 KiB of an error body', async () => {
    engine.failNext(1, { kind: 'status', status: 500, message: 'x'.repeat(1 << 20) });
    const err = await expectRolloutError(ask(client), 'backend_error');
    expect((err.cause as VllmHttpError).body.length).toBe(MAX_ERROR_BODY_BYTES);
    expect((await ask(client)).finishReason).toBe('stop');
  });
});

describe('VllmClient recognises a context-length refusal, narrowly', () => {
  it('the fake engine\'s (vLLM 0.10) 400 becomes a ContextOverflowError carrying the limit', async () => {
    const small = await FakeVllmEngine.start({ tokenizer, model: 'qwen3-test', maxModelLen: prompt.length + 10 });
    try {
      const c = new VllmClient({ url: small.url, model: 'qwen3-test' });
      const err = await expectRolloutError(c.generate({ promptIds: prompt, maxTokens: 64, signal: signal() }), 'backend_error');
      expect(err).toBeInstanceOf(ContextOverflowError);
      expect(err).toMatchObject({ maxModelLen: prompt.length + 10, promptTokens: prompt.length });
      expect(err.cause).toBeInstanceOf(VllmHttpError);
    } finally {
      await small.close();
    }
  });

  it('so does the newer phrasing, flat or nested; an unrelated 400 or a 500 mentioning context does not', async () => {
    const newer = { error: { message: "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is 4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None", type: 'BadRequestError', param: null, code: 400 } };
    const flat = { object: 'error', message: "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (100 in the messages, 2000 in the completion). Please reduce the length of the messages or completion.", type: 'BadRequestError', param: null, code: 400 };
    // Each refusal is of a request it can have been sent for (the prompt it counts, over its limit): one it cannot have
    // caused is not an overflow (review-engine-overflow-claims).
    const cases: Array<[unknown, number, number | undefined, number | undefined, { prompt: number; maxTokens: number }]> = [
      [newer, 400, 4096, 2778, { prompt: 2778, maxTokens: 8000 }],
      [flat, 400, 2048, 100, { prompt: 100, maxTokens: 2000 }],
      [{ error: { message: 'temperature must be non-negative', type: 'BadRequestError', code: 400 } }, 400, undefined, undefined, { prompt: 1, maxTokens: 1 }],
      [flat, 500, undefined, undefined, { prompt: 100, maxTokens: 2000 }],
    ];
    for (const [body, status, limit, promptTokens, request] of cases) {
      const { url, server } = await rawServer(body, status);
      try {
        const promptIds = Array.from({ length: request.prompt }, () => 1);
        const err = await expectRolloutError(new VllmClient({ url, model: 'm' }).generate({ promptIds, maxTokens: request.maxTokens, signal: signal() }), 'backend_error');
        if (limit === undefined) expect(err).not.toBeInstanceOf(ContextOverflowError);
        else expect(err).toMatchObject({ maxModelLen: limit, promptTokens });
      } finally {
        server.close();
      }
    }
  });
});
