import { createServer, type ServerResponse, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { EngineHttp } from '../../src/backends/engine-http.js';
import { ResponseBudget } from '../../src/backends/response-budget.js';
import { createEngineClient } from '../../src/backends/kinds.js';
import { BackendPool } from '../../src/backends/pool.js';
import { parseConfig } from '../../src/config.js';
import { RolloutError } from '../../src/errors.js';
import { eventually, within } from '../support/wait.js';

const signal = (): AbortSignal => new AbortController().signal;

/**
 * An engine stand-in whose answers the test writes: each request is parked with its response until the test answers
 * it (`respond`), so the test decides which answers are on the wire at once.
 */
async function parkingServer(): Promise<{ url: string; server: Server; parked: ServerResponse[] }> {
  const parked: ServerResponse[] = [];
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => parked.push(res));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, parked };
}

const body = (bytes: number, fill: string): string => `"${fill.repeat(bytes - 2)}"`;

describe('engine answers share one budget of bytes buffered at once (ResponseBudget)', () => {
  let server: Server | undefined;
  let http: EngineHttp | undefined;
  afterEach(async () => {
    http?.close();
    server?.closeAllConnections();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    server = undefined;
    http = undefined;
  });

  it('holds an answer that does not fit until one being read ends, then reads it whole: never more than the budget at once', async () => {
    const s = await parkingServer();
    server = s.server;
    const budget = new ResponseBudget(100_000);
    http = new EngineHttp({ url: s.url, label: 'test engine' });
    let peak = 0;
    const track = setInterval(() => (peak = Math.max(peak, budget.heldBytes)), 1);
    const a = http.request('POST', '/a', '{}', signal(), 1 << 20, { budget });
    const b = http.request('POST', '/b', '{}', signal(), 1 << 20, { budget });
    await eventually(() => s.parked.length === 2, 'both requests at the engine');
    const [resA, resB] = s.parked as [ServerResponse, ServerResponse];
    // A's headers and half its body: A holds 60 KB of the 100 KB.
    resA.writeHead(200, { 'content-length': '60000' }).write(body(60_000, 'a').slice(0, 30_000));
    await eventually(() => budget.heldBytes === 60_000, 'A reserved');
    // B is 60 KB too: it must wait for A rather than push the total to 120 KB.
    resB.writeHead(200, { 'content-length': '60000' }).end(body(60_000, 'b'));
    await eventually(() => budget.waiting === 1, 'B waiting for room');
    expect(budget.heldBytes).toBe(60_000);
    resA.end(body(60_000, 'a').slice(30_000));
    const [answerA, answerB] = await within(Promise.all([a, b]), 10_000, 'both answers');
    clearInterval(track);
    expect(answerA.text).toBe(body(60_000, 'a'));
    expect(answerB.text).toBe(body(60_000, 'b'));
    expect(peak).toBeLessThanOrEqual(100_000);
    expect(budget.heldBytes).toBe(0);
    expect(budget.waiting).toBe(0);
  });

  it('fails an answer larger than the whole budget at once as backend_error naming the budget (declared or not), never waits for it', async () => {
    const s = await parkingServer();
    server = s.server;
    const budget = new ResponseBudget(50_000);
    http = new EngineHttp({ url: s.url, label: 'test engine' });
    const declared = http.request('POST', '/declared', '{}', signal(), 1 << 20, { budget });
    const chunked = http.request('POST', '/chunked', '{}', signal(), 1 << 20, { budget });
    await eventually(() => s.parked.length === 2, 'both requests at the engine');
    const [resDeclared, resChunked] = s.parked as [ServerResponse, ServerResponse];
    resDeclared.writeHead(200, { 'content-length': '80000' }).write('"');
    resChunked.writeHead(200).write(body(80_000, 'c').slice(0, 40_000));
    resChunked.write(body(80_000, 'c').slice(40_000, 60_000));
    for (const answer of [declared, chunked]) {
      const err = await within(answer.then(() => undefined, (e: unknown) => e), 10_000, 'the oversized answer');
      expect(err).toBeInstanceOf(RolloutError);
      expect((err as RolloutError).code).toBe('backend_error');
      expect((err as RolloutError).message).toMatch(/50000-byte budget of engine answers buffered at once/);
    }
    expect(budget.heldBytes).toBe(0);
  });

  it('gives the room back when a waiting request is cancelled, and never deadlocks: 12 answers of 60 KB through a 100 KB budget all arrive', async () => {
    const s = await parkingServer();
    server = s.server;
    const budget = new ResponseBudget(100_000);
    http = new EngineHttp({ url: s.url, label: 'test engine' });
    const cancelled = new AbortController();
    const answers = Array.from({ length: 12 }, (_, i) => http!.request('POST', `/r${i}`, '{}', i === 5 ? cancelled.signal : signal(), 1 << 20, { budget }));
    await eventually(() => s.parked.length === 12, 'every request at the engine');
    // The first answer is half sent, so it holds its room; every other engine answers whole at once and waits.
    const first = s.parked[0]!;
    first.writeHead(200, { 'content-length': '60000' }).write(body(60_000, 'a').slice(0, 30_000));
    await eventually(() => budget.heldBytes === 60_000, 'the first answer reserved');
    s.parked.slice(1).forEach((res, i) => res.writeHead(200, { 'content-length': '60000' }).end(body(60_000, String.fromCharCode(98 + i))));
    await eventually(() => budget.waiting === 11, 'eleven answers waiting for room');
    cancelled.abort(new RolloutError('cancelled', 'client went away'));
    await eventually(() => budget.waiting === 10, 'the cancelled one out of the queue');
    first.end(body(60_000, 'a').slice(30_000));
    const settled = await within(Promise.allSettled(answers), 20_000, 'all twelve answers');
    settled.forEach((result, i) => {
      if (i === 5) expect(result.status).toBe('rejected');
      else expect(result).toEqual({ status: 'fulfilled', value: { status: 200, text: body(60_000, String.fromCharCode(97 + i)) } });
    });
    expect(budget.heldBytes).toBe(0);
    expect(budget.waiting).toBe(0);
  });
});

describe('engine clients built for the pool share its budget', () => {
  let server: Server | undefined;
  afterEach(async () => {
    server?.closeAllConnections();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    server = undefined;
  });

  it('a vLLM and an SGLang client given the pool\u2019s budget fail a generate answer larger than it as backend_error', async () => {
    const s = await parkingServer();
    server = s.server;
    const pool = new BackendPool({ maxBufferedResponseBytes: 1 << 20 });
    try {
      for (const kind of ['vllm', 'sglang'] as const) {
        const client = createEngineClient(kind, s.url, 'm', { responseBudget: pool.responseBudget, maxResponseBytes: 4 << 20 });
        const answer = client.generate({ promptIds: [1, 2, 3], maxTokens: 4, signal: signal() });
        await eventually(() => s.parked.length === 1, `the ${kind} request at the engine`);
        s.parked.shift()!.writeHead(200, { 'content-length': String(2 << 20) }).write('{');
        const err = await within(answer.then(() => undefined, (e: unknown) => e), 10_000, `the ${kind} answer`);
        expect(err).toMatchObject({ code: 'backend_error', message: expect.stringMatching(/1048576-byte budget of engine answers buffered at once/) as unknown });
        client.close?.();
      }
      expect(pool.responseBudget.heldBytes).toBe(0);
    } finally {
      pool.close();
    }
  });
});

describe('the pool owns the budget its engine clients share', () => {
  it('is sized by maxBufferedResponseBytes (default 1 GiB) and refuses a size outside its bounds', () => {
    expect(new BackendPool().responseBudget.maxBytes).toBe(1 << 30);
    expect(new BackendPool({ maxBufferedResponseBytes: 8 << 20 }).responseBudget.maxBytes).toBe(8 << 20);
    expect(() => new ResponseBudget(0)).toThrow(/maxBufferedResponseBytes/);
  });

  it('is configured by backendMaxBufferedResponseBytes, bounded to 1 MiB .. 64 GiB', () => {
    expect(parseConfig({}).backendMaxBufferedResponseBytes).toBe(1 << 30);
    expect(parseConfig({ backendMaxBufferedResponseBytes: 1 << 20 }).backendMaxBufferedResponseBytes).toBe(1 << 20);
    for (const bad of [0, (1 << 20) - 1, 64 * 2 ** 30 + 1, 1.5]) {
      expect(() => parseConfig({ backendMaxBufferedResponseBytes: bad }), String(bad)).toThrow(/backendMaxBufferedResponseBytes/);
    }
  });
});
