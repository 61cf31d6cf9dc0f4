import type { Server, ServerResponse } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { EngineHttp } from '../../src/backends/engine-http.js';
import { ResponseBudget } from '../../src/backends/response-budget.js';
import { parkingServer } from '../support/parking-engine.js';
import { eventually, within } from '../support/wait.js';

// A stalled engine (or a proxy in front of it) that takes requests, sends a 200's headers without a content-length,
// then trickles or sends nothing: each of its answers reserves its whole byte cap of the pool's shared ResponseBudget
// and keeps it until the request times out (backendRequestTimeoutMs, 300 s by default). Enough of them held the whole
// budget, and every healthy engine's answer — already generated, sitting in its socket — waited behind them: one sick
// engine stopped the run. Each engine now holds at most its share of the budget (the budget over the engines with
// requests in flight), so the others' answers are read at once.

const signal = (): AbortSignal => new AbortController().signal;

describe('a stalled engine and the shared budget of answer bytes', () => {
  const servers: Server[] = [];
  const clients: EngineHttp[] = [];
  afterEach(async () => {
    for (const c of clients.splice(0)) c.close();
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      await new Promise<void>((resolve) => s.close(() => resolve()));
    }
  });

  async function engine(): Promise<{ http: EngineHttp; parked: ServerResponse[] }> {
    const s = await parkingServer();
    servers.push(s.server);
    const http = new EngineHttp({ url: s.url, label: 'test engine', requestTimeoutMs: 20_000 });
    clients.push(http);
    return { http, parked: s.parked };
  }

  it('cannot hold the whole budget: a healthy engine\u2019s answer is read at once while the stalled one\u2019s sit', async () => {
    const budget = new ResponseBudget(200_000);
    const stalled = await engine();
    const healthy = await engine();
    // The healthy engine is generating (a request in flight) when the stalled engine's answers start.
    const answer = healthy.http.request('POST', '/v1/completions', '{}', signal(), 100_000, { budget });
    void answer.catch(() => undefined); // awaited below; not an unhandled rejection if the test fails first
    const stuck = [1, 2, 3].map(() => stalled.http.request('POST', '/v1/completions', '{}', signal(), 100_000, { budget }).catch((e: unknown) => e));
    await eventually(() => stalled.parked.length === 3 && healthy.parked.length === 1, 'every request at its engine');
    // Headers, no content-length, a first byte — then nothing: each reserves its whole 100 KB cap.
    for (const res of stalled.parked) res.writeHead(200, { 'content-type': 'application/json' }).write('{');
    await eventually(() => budget.heldBytes > 0 && budget.waiting + budget.heldBytes / 100_000 >= 3, 'the stalled answers reserved or queued');
    // The stalled engine holds at most its half (two engines have requests in flight); the healthy answer is read now.
    expect(budget.heldBytes).toBeLessThanOrEqual(100_000);
    healthy.parked[0]!.writeHead(200, { 'content-type': 'application/json', 'content-length': '2' }).end('{}');
    const { text } = await within(answer, 1_000, 'the healthy engine\u2019s answer');
    expect(text).toBe('{}');
    // The stalled answers are still held; once they end, everything is given back.
    for (const res of stalled.parked) res.destroy();
    await Promise.all(stuck);
    await eventually(() => budget.heldBytes === 0 && budget.waiting === 0, 'the budget emptied');
  });

  it('an engine alone may use the whole budget, and an answer larger than its share still goes when it holds nothing', async () => {
    const budget = new ResponseBudget(200_000);
    const only = await engine();
    const other = await engine();
    const a = only.http.request('POST', '/a', '{}', signal(), 150_000, { budget });
    await eventually(() => only.parked.length === 1, 'the request at its engine');
    only.parked[0]!.writeHead(200).write('"');
    await eventually(() => budget.heldBytes === 150_000, 'alone: 150 KB of 200 KB reserved');
    only.parked[0]!.end('x"');
    expect((await a).text).toBe('"x"');
    // Two engines in flight: a 150 KB answer is over its 100 KB share, but its engine holds nothing: it is read.
    const pending = other.http.request('POST', '/p', '{}', signal(), 10_000, { budget });
    const b = only.http.request('POST', '/b', '{}', signal(), 150_000, { budget });
    await eventually(() => only.parked.length === 2 && other.parked.length === 1, 'both requests at their engines');
    only.parked[1]!.writeHead(200).end('"y"');
    expect((await within(b, 1_000, 'the large answer')).text).toBe('"y"');
    other.parked[0]!.writeHead(200, { 'content-length': '2' }).end('{}');
    await pending;
    expect(budget.heldBytes).toBe(0);
  });

  it('ResponseBudget: an answer waiting for its engine\u2019s share lets others pass; one waiting for room does not; leaving engines widen the share', () => {
    const budget = new ResponseBudget(100);
    const a = {};
    const b = {};
    budget.enter(a);
    budget.enter(a);
    budget.enter(b);
    expect(budget.shareBytes).toBe(50);
    expect(budget.reserve(40, () => undefined, a).granted).toBe(true);
    const granted: string[] = [];
    // A's second answer would take A past its 50: it waits, and B's answer behind it is granted at once.
    expect(budget.reserve(30, () => granted.push('a2'), a).granted).toBe(false);
    expect(budget.reserve(50, () => granted.push('b1'), b).granted).toBe(true);
    // Room (total) is short for B's next: it waits, and nothing passes it.
    expect(budget.reserve(20, () => granted.push('b2'), b).granted).toBe(false);
    expect(budget.reserve(5, () => granted.push('b3'), b).granted).toBe(false);
    expect(granted).toEqual([]);
    // B's 50 come back: b2 and b3 go (B holds nothing, then 20 + 5 of its 50); a2 still waits for A's share.
    budget.release(50, b);
    expect(granted).toEqual(['b2', 'b3']);
    expect(budget.heldBytes).toBe(65);
    // B's answers end and B has no request left: A is alone (share 100), a2 goes.
    budget.release(20, b);
    budget.release(5, b);
    budget.leave(b);
    expect(budget.shareBytes).toBe(100);
    expect(granted).toEqual(['b2', 'b3', 'a2']);
    budget.release(40, a);
    budget.release(30, a);
    budget.leave(a);
    budget.leave(a);
    expect(budget.heldBytes).toBe(0);
    expect(budget.shareBytes).toBe(100);
  });

  it('ResponseBudget: an answer over its engine\u2019s share does not hold up another engine\u2019s, even when it would not fit the room either', () => {
    const budget = new ResponseBudget(100);
    const stalled = {};
    const healthy = {};
    budget.enter(stalled);
    budget.enter(healthy);
    expect(budget.reserve(50, () => undefined, stalled).granted).toBe(true);
    expect(budget.reserve(45, () => undefined, healthy).granted).toBe(true);
    const granted: string[] = [];
    // Over the stalled engine's share (and past the room): it waits for the stalled engine's own answers.
    expect(budget.reserve(30, () => granted.push('stalled'), stalled).granted).toBe(false);
    // The healthy engine's 5 fit the room and its share: granted at once, not queued behind it.
    expect(budget.reserve(5, () => granted.push('healthy'), healthy).granted).toBe(true);
    budget.release(45, healthy);
    budget.release(5, healthy);
    expect(budget.reserve(40, () => granted.push('healthy-2'), healthy).granted).toBe(true);
    expect(granted).toEqual([]);
    budget.release(50, stalled);
    expect(granted).toEqual(['stalled']);
  });
});
