import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { abortReason, RolloutError } from '../../src/errors.js';
import { VllmClient, VllmHttpError } from '../../src/backends/vllm-client.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';

let tokenizer: Tokenizer;
let engine: FakeVllmEngine;
let client: VllmClient;
let prompt: number[];

beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
  engine = await FakeVllmEngine.start({ tokenizer, model: 'qwen3-test' });
  client = new VllmClient({ url: engine.url, model: 'qwen3-test', requestTimeoutMs: 5_000 });
  prompt = tokenizer.encode('<|im_start|>user\nWhat is 17 * 23 + 5?<|im_end|>\n<|im_start|>assistant\n');
});

afterAll(async () => {
  await engine?.close();
});

const signal = (): AbortSignal => new AbortController().signal;

async function expectRolloutError(promise: Promise<unknown>, code: string): Promise<RolloutError> {
  const err = await promise.then(
    () => expect.fail('expected a RolloutError'),
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RolloutError);
  expect((err as RolloutError).code).toBe(code);
  return err as RolloutError;
}

/** A one-route server answering every request with `body`, for answers the fake engine never gives. */
async function rawServer(body: unknown): Promise<{ url: string; server: Server }> {
  const server = createServer((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body)));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

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
      return_token_ids: true,
      skip_special_tokens: false,
    });
  });

  it('returns token ids and logprobs exactly as the engine sent them', async () => {
    const result = await client.generate({ promptIds: prompt, maxTokens: 256, seed: 3, signal: signal() });
    const raw = (await (
      await fetch(`${engine.url}/v1/completions`, { method: 'POST', body: JSON.stringify(engine.lastRequest) })
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

  it('rejects an answer without token_ids (an engine too old for return_token_ids)', async () => {
    const { url, server } = await rawServer({ choices: [{ index: 0, text: 'a', logprobs: { token_logprobs: [-0.1] }, finish_reason: 'stop' }] });
    try {
      const old = new VllmClient({ url, model: 'm' });
      await expectRolloutError(old.generate({ promptIds: [1], maxTokens: 2, signal: signal() }), 'backend_error');
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
});
