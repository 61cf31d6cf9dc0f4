import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { abortReason } from '../../src/errors.js';
import { ContextOverflowError } from '../../src/backends/context-overflow.js';
import { MAX_ERROR_BODY_BYTES, type EngineHttpError } from '../../src/backends/engine-http.js';
import { SglangClient } from '../../src/backends/sglang-client.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';
import { expectRolloutError, rawServer } from '../support/engine-client-support.js';

let tokenizer: Tokenizer;
let engine: FakeSglangEngine;
let client: SglangClient;
let prompt: number[];

beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
  engine = await FakeSglangEngine.start({ tokenizer, model: 'qwen3-test' });
  client = new SglangClient({ url: engine.url, model: 'qwen3-test', requestTimeoutMs: 5_000 });
  prompt = tokenizer.encode('<|im_start|>user\nWhat is 17 * 23 + 5?<|im_end|>\n<|im_start|>assistant\n');
});

afterAll(async () => {
  await engine?.close();
});

const signal = (): AbortSignal => new AbortController().signal;

/** An SGLang answer with the given sampled pairs. */
const answer = (pairs: unknown[], extra: Record<string, unknown> = {}) => ({
  text: 'x',
  output_ids: pairs.map((p) => (p as unknown[])[1]),
  meta_info: { id: 'r', finish_reason: { type: 'stop', matched: 151645 }, prompt_tokens: prompt.length, completion_tokens: pairs.length, output_token_logprobs: pairs },
  ...extra,
});

describe('SglangClient against the fake SGLang engine', () => {
  it('sends input_ids, SGLang sampling_params (sampling_seed, max_new_tokens), return_logprob and the rid', async () => {
    await client.generate({ promptIds: prompt, maxTokens: 64, temperature: 0.7, topP: 0.9, topK: 20, seed: 7, stop: ['</answer>'], requestId: 'traj-1-0', signal: signal() });
    expect(engine.lastRequest).toEqual({
      input_ids: prompt,
      sampling_params: {
        max_new_tokens: 64,
        temperature: 0.7,
        top_p: 0.9,
        top_k: 20,
        sampling_seed: 7,
        stop: ['</answer>'],
        skip_special_tokens: false,
        // Sent neutral when the task leaves them unset: SGLang would fill them from the model's generation_config.json.
        min_p: 0,
        repetition_penalty: 1,
        presence_penalty: 0,
        frequency_penalty: 0,
      },
      return_logprob: true,
      logprob_start_len: -1,
      stream: false,
      rid: 'traj-1-0',
    });
  });

  it('sends an unset temperature, top-p and top-k neutral (1, 1, -1), not left to the model\u2019s defaults', async () => {
    await client.generate({ promptIds: prompt, maxTokens: 8, signal: signal() });
    expect(engine.lastRequest?.sampling_params).toMatchObject({ temperature: 1, top_p: 1, top_k: -1 });
  });

  it('returns the ids and logprobs of meta_info.output_token_logprobs exactly', async () => {
    const result = await client.generate({ promptIds: prompt, maxTokens: 256, seed: 3, signal: signal() });
    const raw = (await (await fetch(`${engine.url}/generate`, { method: 'POST', body: JSON.stringify(engine.lastRequest) })).json()) as {
      output_ids: number[];
      meta_info: { output_token_logprobs: Array<[number, number, null]>; finish_reason: { type: string } };
    };
    expect(result.tokenIds).toEqual(raw.output_ids);
    expect(result.tokenIds).toEqual(raw.meta_info.output_token_logprobs.map((p) => p[1]));
    expect(result.logprobs).toEqual(raw.meta_info.output_token_logprobs.map((p) => p[0]));
    expect(result.finishReason).toBe('stop');
    expect(result.tokenIds.at(-1)).toBe(tokenizer.tokenId('<|im_end|>'));
  });

  it('samples what the fake vLLM samples for the same request (one scripted policy)', async () => {
    const a = await client.generate({ promptIds: prompt, maxTokens: 256, seed: 11, signal: signal() });
    const b = await client.generate({ promptIds: prompt, maxTokens: 256, seed: 11, signal: signal() });
    expect(a).toEqual(b);
    expect(tokenizer.decode(a.tokenIds, { skipSpecialTokens: true })).toContain('<tool_call>');
  });

  it('maps finish_reason {type: "length"} when max_new_tokens cuts the answer', async () => {
    const result = await client.generate({ promptIds: prompt, maxTokens: 5, seed: 1, signal: signal() });
    expect(result).toMatchObject({ finishReason: 'length' });
    expect(result.tokenIds).toHaveLength(5);
  });

  it('turns an HTTP 500, a dropped and a refused connection into backend_error', async () => {
    engine.failNext(1);
    const err = await expectRolloutError(client.generate({ promptIds: prompt, maxTokens: 8, signal: signal() }), 'backend_error');
    expect((err.cause as EngineHttpError).status).toBe(500);
    engine.failNext(1, { kind: 'drop' });
    await expectRolloutError(client.generate({ promptIds: prompt, maxTokens: 8, signal: signal() }), 'backend_error');
    const { url, server } = await rawServer({});
    await new Promise((resolve) => server.close(resolve));
    const dead = await expectRolloutError(new SglangClient({ url, model: 'm' }).generate({ promptIds: [1], maxTokens: 1, signal: signal() }), 'backend_error');
    expect(dead.message).toMatch(/^SGLang .* unreachable: ECONNREFUSED/);
  });

  it('keeps the meaning of an abort (cancelled, deadline_exceeded) and fails a request past its timeout', async () => {
    engine.failNext(3, { kind: 'hang' });
    const cancel = new AbortController();
    const cancelled = client.generate({ promptIds: prompt, maxTokens: 8, signal: cancel.signal });
    setTimeout(() => cancel.abort(), 20);
    await expectRolloutError(cancelled, 'cancelled');
    const deadline = new AbortController();
    const late = client.generate({ promptIds: prompt, maxTokens: 8, signal: deadline.signal });
    setTimeout(() => deadline.abort(abortReason('deadline_exceeded', 'turn deadline')), 20);
    await expectRolloutError(late, 'deadline_exceeded');
    const impatient = new SglangClient({ url: engine.url, model: 'qwen3-test', requestTimeoutMs: 50 });
    expect((await expectRolloutError(impatient.generate({ promptIds: prompt, maxTokens: 8, signal: signal() }), 'backend_error')).message).toContain('did not answer within 50 ms');
  });

  it('reports health from GET /health_generate and the context length from GET /v1/models (strict limit: context_len - 1)', async () => {
    expect(await client.health(signal())).toBe(true);
    engine.setHealthy(false);
    expect(await client.health(signal())).toBe(false);
    engine.setHealthy(true);
    expect(await new SglangClient({ url: 'http://127.0.0.1:1', model: 'm' }).health(AbortSignal.timeout(1_000))).toBe(false);
    expect(await new SglangClient({ url: 'http://127.0.0.1:1', model: 'm' }).health(AbortSignal.timeout(1_000), { paused: true })).toBe(false);
    const small = await FakeSglangEngine.start({ tokenizer, model: 'qwen3-test', contextLength: 3072 });
    try {
      expect(await new SglangClient({ url: small.url, model: 'qwen3-test' }).modelInfo(signal())).toEqual({ maxModelLen: 3071 });
    } finally {
      await small.close();
    }
  });
});

describe('SglangClient states the smaller of its context and its token pool as maxModelLen', () => {
  it('takes max_total_num_tokens (GET /get_server_info, each rank\u2019s token_capacity too) when it is below context_len (GET /v1/models)', async () => {
    const small = await FakeSglangEngine.start({ tokenizer, model: 'qwen3-test', contextLength: 4096, maxTotalNumTokens: 1000 });
    const roomy = await FakeSglangEngine.start({ tokenizer, model: 'qwen3-test', contextLength: 4096, maxTotalNumTokens: 100_000 });
    try {
      expect(await new SglangClient({ url: small.url, model: 'qwen3-test' }).modelInfo(signal())).toEqual({ maxModelLen: 999 });
      expect(await new SglangClient({ url: roomy.url, model: 'qwen3-test' }).modelInfo(signal())).toEqual({ maxModelLen: 4095 });
    } finally {
      await Promise.all([small.close(), roomy.close()]);
    }
  });

  it('an engine whose /get_server_info does not say (404, no such field) is limited by its context alone', async () => {
    for (const serverInfo of [{ status: 200, body: { context_length: null, internal_states: [{}] } }, { status: 404, body: { detail: 'Not Found' } }]) {
      const server = createServer((req, res) => {
        const [status, body] = req.url === '/v1/models' ? [200, { data: [{ id: 'm', max_model_len: 2048 }] }] : [serverInfo.status, serverInfo.body];
        res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
      });
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      try {
        const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
        expect(await new SglangClient({ url, model: 'm' }).modelInfo(signal())).toEqual({ maxModelLen: 2047 });
      } finally {
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      }
    }
  });

  it('states the token pool\u2019s limit in a context-length refusal too, not only context_len', async () => {
    const small = await FakeSglangEngine.start({ tokenizer, model: 'qwen3-test', contextLength: 4096, maxTotalNumTokens: 1000 });
    try {
      const sglang = new SglangClient({ url: small.url, model: 'qwen3-test' });
      await sglang.modelInfo(signal());
      const err = await sglang.generate({ promptIds: prompt, maxTokens: 4096, signal: signal() }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ContextOverflowError);
      expect((err as ContextOverflowError).maxModelLen).toBe(999);
    } finally {
      await small.close();
    }
  });
});

describe('SglangClient asks the engine how it runs (GET /get_server_info)', () => {
  it('sums the running-request caps of its data-parallel ranks and leaves the logprobs mode unknown', async () => {
    const dp = await FakeSglangEngine.start({ tokenizer, model: 'qwen3-test', maxRunningRequests: 48, dpSize: 2 });
    try {
      expect(await client.serverInfo(signal())).toEqual({ maxConcurrency: 256 });
      expect(await new SglangClient({ url: dp.url, model: 'qwen3-test' }).serverInfo(signal())).toEqual({ maxConcurrency: 96 });
      await expect(new SglangClient({ url: 'http://127.0.0.1:1', model: 'm' }).serverInfo(AbortSignal.timeout(1_000))).rejects.toMatchObject({ code: 'backend_error' });
    } finally {
      await dp.close();
    }
  });
});

describe('SglangClient checks every engine answer before it becomes a trajectory', () => {
  const ask = (c: SglangClient, extra: { maxTokens?: number } = {}) =>
    c.generate({ promptIds: prompt, maxTokens: extra.maxTokens ?? 64, vocabSize: 151_669, seed: 5, signal: signal() });
  const tamper = (fn: (a: { output_ids: number[]; meta_info: { output_token_logprobs: unknown[]; finish_reason: unknown } }) => void) =>
    engine.failNext(1, { kind: 'tamper', tamper: (a) => fn(a as never) });

  it('refuses token ids outside the vocabulary', async () => {
    tamper((a) => {
      (a.meta_info.output_token_logprobs[1] as unknown[])[1] = 9_999_999;
      a.output_ids[1] = 9_999_999;
    });
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain('output_token_logprobs[1][1] = 9999999 is not an integer in [0, 151669)');
  });

  it('refuses more tokens than max_tokens, positive logprobs and a malformed pair', async () => {
    tamper((a) => (a.meta_info.output_token_logprobs = Array.from({ length: 100 }, () => [-0.5, 7, null])));
    expect((await expectRolloutError(ask(client, { maxTokens: 64 }), 'backend_error')).message).toContain('100 token ids for max_tokens 64');
    tamper((a) => ((a.meta_info.output_token_logprobs[0] as unknown[])[0] = 3.5));
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain('output_token_logprobs[0][0] = 3.5 is positive');
    tamper((a) => (a.meta_info.output_token_logprobs[2] = { logprob: -1, id: 5 }));
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain('output_token_logprobs[2] is an object, not [logprob, token_id, text]');
  });

  it('refuses output_ids that do not end with the ids of output_token_logprobs, and an unfinished answer', async () => {
    tamper((a) => (a.output_ids[0] = a.output_ids[0]! + 1));
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain('output_ids do not end with the ids');
    tamper((a) => a.output_ids.pop());
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain('output_ids do not end with the ids');
    tamper((a) => (a.meta_info.finish_reason = null));
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain('finish_reason is null, not an object');
    tamper((a) => (a.meta_info.finish_reason = { type: 'eos' }));
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain('unexpected finish_reason "eos"');
  });

  // Regression: a logprob list that lost entries was taken as the answer: sampled tokens vanished (or none were left at all).
  it('refuses output_token_logprobs that do not cover every sampled id (output_ids, completion_tokens)', async () => {
    const honest = await ask(client);
    expect(honest.tokenIds.length).toBeGreaterThan(3);
    tamper((a) => (a.meta_info.output_token_logprobs = a.meta_info.output_token_logprobs.slice(3)));
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain("output_ids hold 3 ids before the");
    tamper((a) => (a.meta_info.output_token_logprobs = []));
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain('output_ids hold');
    // Without output_ids the stated count still tells.
    tamper((a) => {
      a.meta_info.output_token_logprobs = a.meta_info.output_token_logprobs.slice(3);
      delete (a as { output_ids?: unknown }).output_ids;
    });
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toMatch(/meta_info\.completion_tokens = \d+, but the answer holds \d+ sampled token ids/);
    tamper((a) => {
      a.meta_info.output_token_logprobs = [];
      a.output_ids = [];
      (a.meta_info as Record<string, unknown>).completion_tokens = 0;
    });
    expect((await expectRolloutError(ask(client), 'backend_error')).message).toContain('no sampled token with finish_reason "stop"');
  });

  it('takes at most 5 "surrounding" ids before the sampled ones in output_ids, and only the prompt’s last ids', async () => {
    const sampled = [[-0.5, 7, null], [-0.25, 8, null]];
    const cases: Array<[number[], string | undefined]> = [
      [[...prompt.slice(-5), 7, 8], undefined],
      [[...prompt.slice(-1), 7, 8], undefined],
      [[...prompt.slice(-6), 7, 8], 'output_ids hold 6 ids before the 2 of meta_info.output_token_logprobs (at most 5'],
      [[prompt.at(-2)!, 7, 8], "not the prompt's last ids"],
    ];
    for (const [outputIds, refusal] of cases) {
      const { url, server } = await rawServer(answer(sampled, { output_ids: outputIds }));
      try {
        const c = new SglangClient({ url, model: 'm' });
        if (refusal === undefined) expect((await ask(c)).tokenIds).toEqual([7, 8]);
        else expect((await expectRolloutError(ask(c), 'backend_error')).message).toContain(refusal);
      } finally {
        server.close();
      }
    }
  });

  it('refuses an answer without logprobs, a batch answer and a body that is not JSON', async () => {
    const cases: Array<[unknown, string]> = [
      [{ text: 'a', output_ids: [1], meta_info: { finish_reason: { type: 'stop' } } }, 'output_token_logprobs missing'],
      [[answer([[-0.1, 1, null]])], 'a batch answer'],
      ['{"text": "a", "meta_info": {"output_token_logprobs": [[NaN, 1, null]]}}', 'body is not JSON'],
    ];
    for (const [body, message] of cases) {
      const { url, server } = await rawServer(body);
      try {
        expect((await expectRolloutError(ask(new SglangClient({ url, model: 'm' })), 'backend_error')).message).toContain(message);
      } finally {
        server.close();
      }
    }
    const ok = await rawServer(answer([[-0.1, 7, null]], { junk: { deep: [[[1]]] } }));
    try {
      expect(await ask(new SglangClient({ url: ok.url, model: 'm' }))).toEqual({ tokenIds: [7], logprobs: [-0.1], finishReason: 'stop', text: 'x' });
    } finally {
      ok.server.close();
    }
  });

  it('takes the sampled ids when output_ids start with prompt ids (SGLang\u2019s detokenizer\u2019s "surrounding" ids)', async () => {
    const sampled: Array<{ tokenIds: readonly number[]; logprobs: readonly number[] }> = [];
    const surrounding = await FakeSglangEngine.start({ tokenizer, model: 'm', surroundingIds: 5, onCompletion: (c) => sampled.push(c) });
    try {
      const c = new SglangClient({ url: surrounding.url, model: 'm' });
      const result = await ask(c);
      expect(sampled).toHaveLength(1);
      expect(result.tokenIds).toEqual(sampled[0]!.tokenIds);
      expect(result.logprobs).toEqual(sampled[0]!.logprobs);
      const raw = (await (await fetch(`${surrounding.url}/generate`, { method: 'POST', body: JSON.stringify(surrounding.lastRequest) })).json()) as { output_ids: number[] };
      expect(raw.output_ids).toEqual([...prompt.slice(-5), ...result.tokenIds]);
    } finally {
      await surrounding.close();
    }
  });

  it('reads "Abort before prefill" (a request aborted in SGLang\u2019s waiting queue: no ids, no logprobs) as an abort with no tokens', async () => {
    const before = { text: '', meta_info: { id: 'r', finish_reason: { type: 'abort', message: 'Abort before prefill' }, prompt_tokens: 0, completion_tokens: 0 } };
    const { url, server } = await rawServer(before);
    try {
      expect(await ask(new SglangClient({ url, model: 'm' }))).toEqual({ tokenIds: [], logprobs: [], finishReason: 'abort', text: '' });
    } finally {
      server.close();
    }
    // Only that: an abort that reports sampled tokens (or text) without their logprobs is still refused.
    const cases = [
      { ...before, meta_info: { ...before.meta_info, completion_tokens: 3 } },
      { ...before, output_ids: [7, 8] },
      { ...before, text: 'partial' },
      { ...before, meta_info: { ...before.meta_info, finish_reason: { type: 'stop', matched: 151645 } } },
    ];
    for (const body of cases) {
      const raw = await rawServer(body);
      try {
        expect((await expectRolloutError(ask(new SglangClient({ url: raw.url, model: 'm' })), 'backend_error')).message).toContain('output_token_logprobs missing');
      } finally {
        raw.server.close();
      }
    }
  });

  it('stops reading an answer past the byte cap, drops the connection and stays usable', async () => {
    const capped = new SglangClient({ url: engine.url, model: 'qwen3-test', maxResponseBytes: 256 * 1024 });
    const before = engine.stats().oversizedBytesSent;
    engine.failNext(1, { kind: 'oversized', bytes: 256 << 20 });
    expect((await expectRolloutError(ask(capped), 'backend_error')).message).toContain('larger than the 262144-byte cap');
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(engine.stats().oversizedBytesSent - before).toBeLessThan(32 << 20);
    expect((await ask(capped)).finishReason).toBe('stop');
  });

  it('keeps at most 64 KiB of an error body', async () => {
    engine.failNext(1, { kind: 'status', status: 500, message: 'x'.repeat(1 << 20) });
    expect(((await expectRolloutError(ask(client), 'backend_error')).cause as EngineHttpError).body.length).toBe(MAX_ERROR_BODY_BYTES);
  });
});

describe('SglangClient recognises SGLang\u2019s context-length refusal, narrowly', () => {
  it('both of SGLang\u2019s phrasings become ContextOverflowError with the strict limit; others stay backend_error', async () => {
    const small = await FakeSglangEngine.start({ tokenizer, contextLength: prompt.length + 10 });
    try {
      const c = new SglangClient({ url: small.url, model: 'm' });
      const total = await expectRolloutError(c.generate({ promptIds: prompt, maxTokens: 10, signal: signal() }), 'backend_error');
      expect(total).toBeInstanceOf(ContextOverflowError);
      expect(total).toMatchObject({ maxModelLen: prompt.length + 9, promptTokens: prompt.length });
      // prompt + max_tokens = context_len - 1 is accepted: the reported limit is usable as is.
      expect((await c.generate({ promptIds: prompt, maxTokens: 9, signal: signal() })).tokenIds.length).toBeLessThanOrEqual(9);
    } finally {
      await small.close();
    }
    const input = { error: { message: "The input (5000 tokens) is longer than the model's context length (4096 tokens)." } };
    const unrelated = { error: { message: 'top_p must be in (0, 1], got 2.0.' } };
    for (const [body, status, limit] of [[input, 400, 4095], [unrelated, 400, undefined], [input, 500, undefined]] as const) {
      const { url, server } = await rawServer(body, status);
      try {
        // A request of the 5000 tokens the refusal counts (one it cannot have caused is no overflow).
        const err = await expectRolloutError(new SglangClient({ url, model: 'm' }).generate({ promptIds: Array.from({ length: 5000 }, () => 1), maxTokens: 1, signal: signal() }), 'backend_error');
        if (limit === undefined) expect(err).not.toBeInstanceOf(ContextOverflowError);
        else expect(err).toMatchObject({ maxModelLen: limit, promptTokens: 5000 });
      } finally {
        server.close();
      }
    }
  });
});

describe('SglangClient control operations', () => {
  it('aborts one request by rid: it answers finish "abort" with the tokens decoded so far', async () => {
    const slow = await FakeSglangEngine.start({ tokenizer, tokenLatencyMs: 20 });
    try {
      const c = new SglangClient({ url: slow.url, model: 'm' });
      const victim = c.generate({ promptIds: prompt, maxTokens: 256, seed: 2, requestId: 'victim', signal: signal() });
      const other = c.generate({ promptIds: prompt, maxTokens: 256, seed: 2, requestId: 'other', signal: signal() });
      await expect.poll(() => slow.inflightRequestIds().sort()).toEqual(['other', 'victim']);
      await new Promise((resolve) => setTimeout(resolve, 60));
      await c.abort(['victim', 'unknown'], signal());
      const aborted = await victim;
      expect(aborted.finishReason).toBe('abort');
      expect(aborted.tokenIds.length).toBeGreaterThan(0);
      expect(aborted.tokenIds.length).toBe(aborted.logprobs.length);
      const full = await other;
      expect(full.finishReason).toBe('stop');
      expect(full.tokenIds.slice(0, aborted.tokenIds.length)).toEqual(aborted.tokenIds);
    } finally {
      await slow.close();
    }
  });

  it('pauses in abort mode (everything in flight aborted, new requests wait) and resumes', async () => {
    const slow = await FakeSglangEngine.start({ tokenizer, tokenLatencyMs: 10 });
    try {
      const c = new SglangClient({ url: slow.url, model: 'm' });
      const running = c.generate({ promptIds: prompt, maxTokens: 256, requestId: 'a', signal: signal() });
      await expect.poll(() => slow.inflightRequestIds()).toEqual(['a']);
      await c.pause('abort', signal());
      expect((await running).finishReason).toBe('abort');
      // Paused, SGLang's generate-based health check waits at the pause; the liveness check a paused engine gets answers.
      expect(await c.health(AbortSignal.timeout(300))).toBe(false);
      expect(await c.health(AbortSignal.timeout(2_000), { paused: true })).toBe(true);
      let settled = false;
      const waiting = c.generate({ promptIds: prompt, maxTokens: 256, requestId: 'b', signal: signal() }).finally(() => (settled = true));
      await new Promise((resolve) => setTimeout(resolve, 100));
      expect(settled).toBe(false);
      await c.resume(signal());
      expect((await waiting).finishReason).toBe('stop');
      await c.abort(undefined, signal());
    } finally {
      await slow.close();
    }
  });

  it('pauses in keep mode (SGLang in_place): a frozen request continues on resume; wait mode is refused', async () => {
    const slow = await FakeSglangEngine.start({ tokenizer, tokenLatencyMs: 5 });
    try {
      const c = new SglangClient({ url: slow.url, model: 'm' });
      const running = c.generate({ promptIds: prompt, maxTokens: 256, seed: 4, requestId: 'k', signal: signal() });
      await expect.poll(() => slow.inflightRequestIds()).toEqual(['k']);
      await c.pause('keep', signal());
      expect(slow.paused).toBe(true);
      await c.resume(signal());
      expect((await running).finishReason).toBe('stop');
      const err = await expectRolloutError(c.pause('wait', signal()), 'invalid_argument');
      expect(err.message).toContain('no "wait" pause mode');
    } finally {
      await slow.close();
    }
  });

  it('refuses a request id that cannot travel as a header value', async () => {
    await expectRolloutError(client.generate({ promptIds: prompt, maxTokens: 4, requestId: 'has space', signal: signal() }), 'invalid_argument');
  });
});
