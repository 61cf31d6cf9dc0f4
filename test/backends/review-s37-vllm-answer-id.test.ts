import { createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { parseConfig } from '../../src/config.js';
import { RolloutError } from '../../src/errors.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { expectRolloutError } from '../support/engine-client-support.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

/**
 * vLLM answers were checked for misdelivery by their prompt length only (usage.prompt_tokens), which cannot tell apart
 * two requests whose prompts have the same length — the samples of a GRPO group share their prompt. vLLM names each
 * completion `cmpl-<X-Request-Id>` after the header it was sent with; with a backend's `checkAnswerId` (opt-in: a
 * gateway may rename answers) another id is refused as an engine error, never tokens in a trajectory.
 *
 * The engine here is a TEST DOUBLE of a faulty vLLM (or a proxy in front of one) that answers the first request on a
 * connection twice, the copy late: on a keep-alive connection the copy is read as the next request's answer.
 */
function completionFor(requestId: string, promptLength: number, ids: number[]): string {
  return JSON.stringify({
    id: `cmpl-${requestId}`,
    object: 'text_completion',
    model: 'm',
    choices: [{ index: 0, text: 'ab', finish_reason: 'stop', stop_reason: null, logprobs: { token_logprobs: ids.map(() => -0.5), tokens: ids.map((id) => `token_id:${id}`) } }],
    usage: { prompt_tokens: promptLength, completion_tokens: ids.length, total_tokens: promptLength + ids.length },
  });
}

const response = (body: string): string =>
  `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nkeep-alive: timeout=5\r\n\r\n${body}`;

async function duplicatingEngine(): Promise<{ url: string; server: Server; sockets: Set<Socket> }> {
  let requests = 0;
  let firstAnswer = '';
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('data', (data) => {
      for (const head of data.toString().split('\r\n\r\n').filter((part) => part.startsWith('POST'))) {
        const n = ++requests;
        const requestId = /^x-request-id: *(\S+)/im.exec(head)?.[1] ?? `unnamed-${n}`;
        const own = completionFor(requestId, 3, n === 1 ? [7, 8] : [9]);
        if (n === 1) firstAnswer = own;
        // The first answer's copy once the next request is on the connection, before that request's own answer.
        if (n === 2) socket.write(response(firstAnswer));
        socket.write(response(own));
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, sockets };
}

const signal = (): AbortSignal => new AbortController().signal;
let engine: Awaited<ReturnType<typeof duplicatingEngine>> | undefined;
let harness: ServerHarness | undefined;
afterEach(async () => {
  for (const s of engine?.sockets ?? []) s.destroy();
  await new Promise<void>((resolve) => (engine ? engine.server.close(() => resolve()) : resolve()));
  engine = undefined;
  await harness?.close();
  harness = undefined;
});

describe('a vLLM answer meant for another request with a prompt of the same length', () => {
  it('is refused with checkAnswerId: its id is not cmpl-<this request\u2019s X-Request-Id> (backend_error, no tokens)', async () => {
    engine = await duplicatingEngine();
    const client = new VllmClient({ url: engine.url, model: 'm', maxSockets: 1, checkAnswerId: true });
    try {
      const first = await client.generate({ promptIds: [1, 2, 3], maxTokens: 8, vocabSize: 100, requestId: 'traj-0', signal: signal() });
      expect(first.tokenIds).toEqual([7, 8]);
      const err = await expectRolloutError(client.generate({ promptIds: [4, 5, 6], maxTokens: 8, vocabSize: 100, requestId: 'traj-1', signal: signal() }), 'backend_error');
      expect(err.message).toMatch(/sent a malformed completion: id = "cmpl-traj-0", but the request's completion id \(cmpl-<X-Request-Id>\) is "cmpl-traj-1"/);
    } finally {
      client.close();
    }
  });

  it('is not checked by default (a gateway may rename answers): only the prompt length is, and it matches here', async () => {
    engine = await duplicatingEngine();
    const client = new VllmClient({ url: engine.url, model: 'm', maxSockets: 1 });
    try {
      await client.generate({ promptIds: [1, 2, 3], maxTokens: 8, vocabSize: 100, requestId: 'traj-0', signal: signal() });
      // What the opt-in exists for: without it the other request's tokens are taken.
      expect((await client.generate({ promptIds: [4, 5, 6], maxTokens: 8, vocabSize: 100, requestId: 'traj-1', signal: signal() })).tokenIds).toEqual([7, 8]);
    } finally {
      client.close();
    }
  });

  it('passes when the id is the request\u2019s (a vLLM double naming its answers as vLLM does), and a request without an id is not checked', async () => {
    const { tokenizer } = await loadQwen3();
    const fake = await FakeVllmEngine.start({
      tokenizer,
      tokenLatencyMs: 0,
      // As vLLM's serving_completion.py: the completion is named cmpl-<X-Request-Id> (the client sends it as request_id too).
      inject: ({ body }) => (typeof body.request_id === 'string' ? { kind: 'tamper', tamper: (_choice, answer) => void (answer.id = `cmpl-${String(body.request_id)}`) } : undefined),
    });
    const client = new VllmClient({ url: fake.url, model: fake.model, checkAnswerId: true });
    try {
      const prompt = tokenizer.encode('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
      await expect(client.generate({ promptIds: prompt, maxTokens: 8, requestId: 'named-1', signal: signal() })).resolves.toMatchObject({ finishReason: expect.any(String) });
      await expect(client.generate({ promptIds: prompt, maxTokens: 8, signal: signal() })).resolves.toMatchObject({ finishReason: expect.any(String) });
    } finally {
      client.close();
      await fake.close();
    }
  });

  it('is set per backend in the server config and reaches the engine client: answers the vLLM double names cmpl-fake-<n> are refused', async () => {
    const { tokenizer } = await loadQwen3();
    const fake = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 0 });
    try {
      harness = await startServerHarness({ config: { backends: [{ url: fake.url, id: 'checked', checkAnswerId: true, maxConcurrency: 4 }] } });
      const pool = harness.server.runtime.deps.pool;
      const lease = await pool.acquire('t');
      const prompt = tokenizer.encode('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
      const err = await expectRolloutError(lease.generate({ promptIds: prompt, maxTokens: 8, signal: signal() }), 'backend_error');
      // A misdelivery is asked again (review-s38-misdelivery-retry): every answer of this double is refused, so the
      // request ends once its retries are spent, naming the last refusal.
      expect(err.message).toMatch(/lost its backend \d+ times \(last: backend checked misdelivered: .*id = "cmpl-fake-\d+", but the request's completion id \(cmpl-<X-Request-Id>\) is "cmpl-/);
      lease.release();
    } finally {
      await harness?.close();
      harness = undefined;
      await fake.close();
    }
  });

  it('is refused in the config for a backend that is not vLLM, naming the field', () => {
    expect(parseConfig({ backends: [{ url: 'http://127.0.0.1:1', checkAnswerId: true }] }).backends[0]!.checkAnswerId).toBe(true);
    expect(parseConfig({ backends: [{ url: 'http://127.0.0.1:1' }] }).backends[0]!.checkAnswerId).toBe(false);
    let err: unknown;
    try {
      parseConfig({ backends: [{ kind: 'sglang', url: 'http://127.0.0.1:1', checkAnswerId: true }] });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(RolloutError);
    expect((err as RolloutError).field).toBe('backends.0.checkAnswerId');
    expect((err as RolloutError).message).toMatch(/is for vllm backends \(an sglang engine's answers are always checked\)/);
  });
});
