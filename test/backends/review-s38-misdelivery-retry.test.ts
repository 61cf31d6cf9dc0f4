import { createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { SglangClient } from '../../src/backends/sglang-client.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { RolloutError } from '../../src/errors.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { FakeVllmEngine, type InjectedFailure } from '../../src/testing/fake-vllm.js';
import { poolSuite } from '../support/pool-suite.js';

/**
 * A misdelivered answer — one whose usage.prompt_tokens is not the prompt we sent, or (checkAnswerId) whose id is not
 * ours: a gateway or proxy mixing answers up — is an engine/transport fault like a dropped connection: never put into
 * the trajectory, counted on its backend, and the request asked again (on another engine when there is one), bounded
 * by maxFailoversPerRequest. It used to end the trajectory BACKEND_ERROR at once. The engines are fake vLLMs over real
 * HTTP (test doubles); the one of the last block misbehaves at the HTTP level (its connection falls out of step).
 */

const suite = poolSuite({ question: 'What is 6 * 7?' });
const signal = (): AbortSignal => new AbortController().signal;
/** A fake vLLM fault: the answer says it answered a prompt of another length (a copy of another request's answer). */
const misdelivered: InjectedFailure = { kind: 'tamper', tamper: (_choice, answer) => void ((answer.usage as Record<string, number>).prompt_tokens = 1) };

describe('a misdelivered answer in the pool', () => {
  it('moves the request to another engine, which answers it; the misdelivery is counted on its backend', async () => {
    const bad = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0 }));
    const good = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0 }));
    bad.failNext(1, misdelivered);
    const pool = suite.makePool();
    pool.add(new VllmClient({ url: bad.url, model: 'fake-qwen3' }), { id: 'bad', maxConcurrency: 8, model: 'fake-qwen3', maxModelLen: 40960 });
    pool.add(new VllmClient({ url: good.url, model: 'fake-qwen3' }), { id: 'good', maxConcurrency: 4, model: 'fake-qwen3', maxModelLen: 40960 });
    const lease = await pool.acquire('t');
    expect(lease.backendId).toBe('bad');
    const result = await lease.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: signal() });
    expect(result.backendId).toBe('good');
    expect(result.tokenIds.length).toBeGreaterThan(0);
    expect(lease.failovers).toBe(1);
    expect(bad.stats().received).toBe(1);
    expect(good.stats().received).toBe(1);
    expect(pool.list().find((b) => b.id === 'bad')?.misdeliveredAnswers).toBe(1);
    expect(pool.list().find((b) => b.id === 'good')?.misdeliveredAnswers).toBe(0);
    // The engine itself is not taken out: it answers its probes, only that one answer was refused.
    expect(pool.list().find((b) => b.id === 'bad')?.healthy).toBe(true);
    lease.release();
  });

  it('is asked again on the same engine when it is the only one', async () => {
    const engine = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0 }));
    engine.failNext(2, misdelivered);
    const pool = suite.makePool();
    pool.add(new VllmClient({ url: engine.url, model: 'fake-qwen3' }), { id: 'only', maxConcurrency: 4, model: 'fake-qwen3', maxModelLen: 40960 });
    const lease = await pool.acquire('t');
    const result = await lease.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: signal() });
    expect(result).toMatchObject({ backendId: 'only', finishReason: expect.any(String) });
    expect(engine.stats().received).toBe(3);
    expect(lease.failovers).toBe(0);
    expect(pool.list()[0]?.misdeliveredAnswers).toBe(2);
    lease.release();
  });

  it('SGLang too: an answer naming another rid (meta_info.id) is asked again, on another engine', async () => {
    const bad = suite.track(await FakeSglangEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0 }));
    const good = suite.track(await FakeSglangEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0 }));
    bad.failNext(1, { kind: 'tamper', tamper: (_choice, answer) => void ((answer.meta_info as Record<string, unknown>).id = 'someone-else') });
    const pool = suite.makePool();
    pool.add(new SglangClient({ url: bad.url, model: 'fake-qwen3' }), { id: 'bad', maxConcurrency: 8, model: 'fake-qwen3', maxModelLen: 40960 });
    pool.add(new SglangClient({ url: good.url, model: 'fake-qwen3' }), { id: 'good', maxConcurrency: 4, model: 'fake-qwen3', maxModelLen: 40960 });
    const lease = await pool.acquire('t');
    expect(lease.backendId).toBe('bad');
    await expect(lease.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: signal() })).resolves.toMatchObject({ backendId: 'good' });
    expect(pool.list().find((b) => b.id === 'bad')?.misdeliveredAnswers).toBe(1);
    lease.release();
  });

  it('ends in backend_error, saying so, once maxFailoversPerRequest retries were misdelivered too (bounded)', async () => {
    const engine = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, tokenLatencyMs: 0, inject: () => misdelivered }));
    const pool = suite.makePool({ maxFailoversPerRequest: 2 });
    pool.add(new VllmClient({ url: engine.url, model: 'fake-qwen3' }), { id: 'only', maxConcurrency: 4, model: 'fake-qwen3', maxModelLen: 40960 });
    const lease = await pool.acquire('t');
    const err = await lease.generate({ promptIds: suite.prompt, maxTokens: 16, seed: 1, signal: signal() }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(RolloutError);
    expect((err as RolloutError).code).toBe('backend_error');
    expect((err as RolloutError).message).toMatch(/lost its backend 3 times \(last: backend only misdelivered/);
    expect(engine.stats().received).toBe(3);
    expect(pool.list()[0]?.misdeliveredAnswers).toBe(3);
    lease.release();
  });
});

/**
 * A TEST DOUBLE of a faulty vLLM or proxy at the HTTP level: its first connection answers the first request twice, the
 * copy once the second request is on the connection — and from then on that connection stays one answer behind (each
 * request there gets the previous one's answer, its own kept back until the next). Other connections answer right.
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

async function outOfStepEngine(): Promise<{ url: string; server: Server; sockets: Set<Socket>; connections: () => number }> {
  const sockets = new Set<Socket>();
  let connections = 0;
  const server = createServer((socket) => {
    const first = connections++ === 0;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    let held: string | undefined;
    let n = 0;
    socket.on('data', (data) => {
      for (const head of data.toString().split('\r\n\r\n').filter((part) => part.startsWith('POST'))) {
        const requestId = /^x-request-id: *(\S+)/im.exec(head)?.[1] ?? 'unnamed';
        // Every prompt the test sends has 3 ids: only the id tells the answers apart.
        const own = completionFor(requestId, 3, [7 + n]);
        n++;
        if (!first) {
          socket.write(response(own));
        } else if (held === undefined) {
          socket.write(response(own));
          held = own; // answered; its copy goes out with the next request
        } else {
          socket.write(response(held));
          held = own;
        }
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, sockets, connections: () => connections };
}

let engine: Awaited<ReturnType<typeof outOfStepEngine>> | undefined;
afterEach(async () => {
  for (const s of engine?.sockets ?? []) s.destroy();
  await new Promise<void>((resolve) => (engine ? engine.server.close(() => resolve()) : resolve()));
  engine = undefined;
});

describe('the keep-alive connection an answer was refused on', () => {
  it('is discarded: the next request goes on a new connection and gets its own answer, not the one held back', async () => {
    engine = await outOfStepEngine();
    const client = new VllmClient({ url: engine.url, model: 'm', maxSockets: 1, checkAnswerId: true });
    const ask = (requestId: string, promptIds: number[]): Promise<unknown> =>
      client.generate({ promptIds, maxTokens: 8, vocabSize: 100, requestId, signal: signal() }).then(
        (r) => r.tokenIds,
        (e: unknown) => (e instanceof RolloutError ? e.message : e),
      );
    try {
      expect(await ask('traj-0', [1, 2, 3])).toEqual([7]);
      expect(await ask('traj-1', [4, 5, 6])).toMatch(/id = "cmpl-traj-0", but the request's completion id/);
      // Before the fix the refused connection was kept: this request read traj-1's answer held back there.
      expect(await ask('traj-2', [7, 8, 9])).toEqual([7]);
      expect(engine.connections()).toBe(2);
    } finally {
      client.close();
    }
  });
});
