import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { EngineHttp } from '../../src/backends/engine-http.js';
import { backendKind } from '../../src/backends/kinds.js';
import { SglangClient } from '../../src/backends/sglang-client.js';
import type { EngineClient } from '../../src/backends/types.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { expectRolloutError } from '../support/engine-client-support.js';

/**
 * A TEST DOUBLE engine that records the request target (path and query) and authorization of every request and answers
 * `{}`: only where each request goes matters here, not what the clients make of the answer.
 */
let server: Server;
let origin: string;
const seen: Array<{ target: string; authorization: string | undefined }> = [];

beforeAll(async () => {
  server = createServer((req, res) => {
    seen.push({ target: req.url ?? '', authorization: req.headers.authorization });
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{}'));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});
beforeEach(() => {
  seen.length = 0;
});

const signal = (): AbortSignal => new AbortController().signal;

/** Every request the client can make (each one's outcome does not matter: the answers are `{}`). */
async function everyRequest(client: EngineClient): Promise<string[]> {
  const calls: Array<() => Promise<unknown>> = [
    () => client.generate({ promptIds: [1, 2, 3], maxTokens: 4, requestId: 'r1', signal: signal() }),
    () => client.health(signal()),
    () => client.health(signal(), { paused: true }),
    () => client.modelInfo!(signal()),
    () => client.serverInfo!(signal()),
    () => client.pause!('keep', signal()),
    () => client.resume!(signal()),
    () => client.abort!(['r1'], signal()),
  ];
  for (const call of calls) await call().catch(() => undefined);
  client.close?.();
  return seen.map((s) => s.target);
}

const VLLM_TARGETS = ['/v1/completions', '/health', '/health', '/v1/models', '/server_info?config_format=json', '/pause?mode=keep', '/resume', '/abort_requests'];
// modelInfo asks GET /get_server_info too (the token pool), serverInfo asks it for the capacity.
const SGLANG_TARGETS = ['/generate', '/health_generate', '/get_model_info', '/v1/models', '/get_server_info', '/get_server_info', '/pause_generation', '/continue_generation', '/abort_request'];
const sorted = (targets: string[]): string[] => [...targets].sort();
const withQuery = (target: string, query: string): string => `${target}${target.includes('?') ? '&' : '?'}${query}`;

describe('an engine URL becomes request URLs the same way for every request', () => {
  it('keeps a path prefix (with or without a trailing slash) before every vLLM and SGLang path', async () => {
    for (const prefix of ['/gw/engine-7', '/gw/engine-7/', '/gw/engine-7//']) {
      seen.length = 0;
      expect(sorted(await everyRequest(new VllmClient({ url: `${origin}${prefix}`, model: 'm' })))).toEqual(sorted(VLLM_TARGETS.map((t) => `/gw/engine-7${t}`)));
      seen.length = 0;
      expect(sorted(await everyRequest(new SglangClient({ url: `${origin}${prefix}`, model: 'm' })))).toEqual(sorted(SGLANG_TARGETS.map((t) => `/gw/engine-7${t}`)));
    }
  });

  it('keeps a query string (a gateway\u2019s key) on every request, after the path, merged with the request\u2019s own parameters', async () => {
    expect(sorted(await everyRequest(new VllmClient({ url: `${origin}/?key=abc`, model: 'm' })))).toEqual(sorted(VLLM_TARGETS.map((t) => withQuery(t, 'key=abc'))));
    seen.length = 0;
    expect(sorted(await everyRequest(new SglangClient({ url: `${origin}/gw?key=abc&x`, model: 'm' })))).toEqual(
      sorted(SGLANG_TARGETS.map((t) => withQuery(`/gw${t}`, 'key=abc&x'))),
    );
    // A parameter the request sets itself is the request's: the engine URL's is not sent with it.
    seen.length = 0;
    const client = new VllmClient({ url: `${origin}?mode=abort&key=abc`, model: 'm' });
    await client.pause('keep', signal());
    client.close();
    expect(seen.map((s) => s.target)).toEqual(['/pause?mode=keep&key=abc']);
  });

  it('sends userinfo as basic auth and no userinfo in the path, with or without a trailing slash', async () => {
    for (const url of [`${origin.replace('http://', 'http://user:pw@')}/`, origin.replace('http://', 'http://user:pw@')]) {
      seen.length = 0;
      expect(sorted(await everyRequest(new VllmClient({ url, model: 'm' })))).toEqual(sorted(VLLM_TARGETS));
      expect(new Set(seen.map((s) => s.authorization))).toEqual(new Set([`Basic ${Buffer.from('user:pw').toString('base64')}`]));
    }
  });

  it('refuses a URL ending in /v1 (an OpenAI client\u2019s base URL) and one with a fragment, naming the field and why: at config/AddBackend and in the client', async () => {
    const cases: Array<[string, RegExp]> = [
      [`${origin}/v1`, /\/v1.*base URL/],
      [`${origin}/v1/`, /\/v1.*base URL/],
      [`${origin}/gw/v1`, /\/v1.*base URL/],
      [`${origin}/#frag`, /fragment/],
    ];
    for (const [url, why] of cases) {
      for (const kind of ['vllm', 'sglang'] as const) {
        expect(backendKind(kind).urlProblem(url)).toMatch(why);
        const err = await expectRolloutError(Promise.resolve().then(() => backendKind(kind).create(url, 'm', {})), 'invalid_argument');
        expect(err.field).toBe('url');
        expect(err.message).toMatch(why);
      }
      expect(() => new EngineHttp({ url, label: 'vLLM' })).toThrow(why);
    }
    // Not refused: a path that merely contains v1, and a version other than the one the clients add.
    for (const url of [`${origin}/v1x`, `${origin}/models/v1/engine`, `${origin}/v2`]) expect(backendKind('vllm').urlProblem(url)).toBeUndefined();
    expect(seen).toEqual([]);
  });
});
