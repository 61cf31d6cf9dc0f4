import type { Server, ServerResponse } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { DEFAULT_BODY_IDLE_MS, EngineHttp, EngineUnreachableError } from '../../src/backends/engine-http.js';
import { ResponseBudget } from '../../src/backends/response-budget.js';
import { parkingServer } from '../support/parking-engine.js';
import { eventually, within } from '../support/wait.js';

// An engine (or a proxy in front of it) that sends an answer's headers and then stalls held the request, its pool slot
// and its sticky trajectory until backendRequestTimeoutMs (300 s), then ended BACKEND_ERROR without failover: a
// timeout is not read as "unreachable" (left by helper-60's review). vLLM and SGLang send a non-streaming answer's
// headers and body together, so a body silent for bodyIdleTimeoutMs is a stall; it now fails as unreachable (the pool
// checks the engine and moves the trajectory). A long generation (no headers yet) and a wait for budget room are not
// silence. The engines here are raw HTTP servers parking each request until the test answers it (test doubles).

const signal = (): AbortSignal => new AbortController().signal;

describe('an answer whose body stalls after its headers', () => {
  const servers: Server[] = [];
  const clients: EngineHttp[] = [];
  afterEach(async () => {
    for (const c of clients.splice(0)) c.close();
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      await new Promise<void>((resolve) => s.close(() => resolve()));
    }
  });

  async function engine(bodyIdleTimeoutMs: number): Promise<{ http: EngineHttp; parked: ServerResponse[] }> {
    const { url, server, parked } = await parkingServer();
    servers.push(server);
    const http = new EngineHttp({ url, label: 'test engine', requestTimeoutMs: 60_000, bodyIdleTimeoutMs });
    clients.push(http);
    return { http, parked };
  }

  it('fails as unreachable once the body sent nothing for bodyIdleTimeoutMs, long before the request timeout', async () => {
    expect(DEFAULT_BODY_IDLE_MS).toBe(30_000);
    const e = await engine(300);
    const started = performance.now();
    const answer = e.http.request('POST', '/v1/completions', '{}', signal(), 1 << 20).catch((err: unknown) => err);
    await eventually(() => e.parked.length === 1, 'the request at the engine');
    e.parked[0]!.writeHead(200, { 'content-type': 'application/json' }).write('{"id":');
    const err = await within(answer, 10_000, 'the stalled answer to fail');
    expect(err).toBeInstanceOf(EngineUnreachableError);
    expect((err as Error).message).toMatch(/sent the headers of its POST \/v1\/completions answer \(HTTP 200\), then nothing for 300 ms \(6 bytes of body\)/);
    expect(performance.now() - started).toBeLessThan(10_000);
  });

  it('leaves alone a long generation (no headers yet) and a body that keeps moving, however slowly', async () => {
    const e = await engine(300);
    const answer = e.http.request('POST', '/v1/completions', '{}', signal(), 1 << 20);
    await eventually(() => e.parked.length === 1, 'the request at the engine');
    await new Promise((resolve) => setTimeout(resolve, 900)); // generating: three idle periods without headers
    const res = e.parked[0]!;
    res.writeHead(200, { 'content-type': 'application/json' });
    for (const piece of ['{"a"', ':', '1', '}']) {
      res.write(piece);
      await new Promise((resolve) => setTimeout(resolve, 150)); // each gap under 300 ms; 600 ms in all
    }
    res.end();
    expect((await answer).text).toBe('{"a":1}');
  });

  it('does not count the wait for room in the answer budget as the engine\u2019s silence', async () => {
    const budget = new ResponseBudget(1_000);
    const e = await engine(300);
    const first = e.http.request('POST', '/first', '{}', signal(), 1_000, { budget });
    await eventually(() => e.parked.length === 1, 'the first request at the engine');
    const a = e.parked[0]!;
    a.writeHead(200).write('"'); // reserves the whole budget (no content-length: its cap)
    await eventually(() => budget.heldBytes === 1_000, 'the first answer holding the budget');
    const second = e.http.request('POST', '/second', '{}', signal(), 1_000, { budget });
    await eventually(() => e.parked.length === 2, 'the second request at the engine');
    e.parked[1]!.writeHead(200, { 'content-length': '4' }).end('"ok"'); // all sent; not read until there is room
    await eventually(() => budget.waiting === 1, 'the second answer waiting for room');
    // The first answer's body keeps moving for 900 ms (three idle periods) while the second waits.
    for (let i = 0; i < 6; i++) {
      a.write('x');
      await new Promise((resolve) => setTimeout(resolve, 150));
    }
    a.end('"');
    expect((await first).text).toBe(`"${'x'.repeat(6)}"`);
    expect((await second).text).toBe('"ok"');
  });
});
