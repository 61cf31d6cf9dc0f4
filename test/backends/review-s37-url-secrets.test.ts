import { createServer, request, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { EngineHttp, withoutCredentials } from '../../src/backends/engine-http.js';
import { parseConfig } from '../../src/config.js';
import { RolloutError } from '../../src/errors.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { deadUrl, startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { capturedLogger } from '../support/test-environments.js';

// An engine URL's query string (a gateway's `?api_key=...`) was shown verbatim wherever the URL is: ListBackends, the
// default backend id (and so every log line and metric naming the backend), error messages and logs. Userinfo was
// already dropped. Query values are now masked wherever an engine URL is shown; requests still carry them.

const KEY = 'S3CRET-QUERY-KEY';
const PASS = 'S3CRET-USERINFO-PASS';
const KEY2 = 'S3CRET-ADDED-KEY';
const PASS2 = 'S3CRET-ADDED-PASS';
const SECRETS = [KEY, PASS, KEY2, PASS2];

/**
 * A TEST DOUBLE of an authenticating gateway in front of a (fake) vLLM: every request must carry `?api_key=KEY` and
 * basic auth `op:PASS`, else 401; it forwards the rest (query dropped) and records what it saw. `failNext` answers the
 * next completion 500 or drops its connection, to draw errors that name the engine.
 */
async function gateway(target: string): Promise<{ url: string; server: Server; seen: Array<{ key: string | null; auth: string | undefined }>; failNext: Array<'500' | 'drop'> }> {
  const seen: Array<{ key: string | null; auth: string | undefined }> = [];
  const failNext: Array<'500' | 'drop'> = [];
  const upstream = new URL(target);
  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://gateway');
    seen.push({ key: url.searchParams.get('api_key'), auth: req.headers.authorization });
    if (url.searchParams.get('api_key') !== KEY || req.headers.authorization !== `Basic ${Buffer.from(`op:${PASS}`).toString('base64')}`) {
      req.resume();
      res.writeHead(401).end('unauthorized');
      return;
    }
    if (url.pathname === '/v1/completions' && failNext.length > 0) {
      const fault = failNext.shift();
      req.resume();
      if (fault === 'drop') req.socket.destroy();
      else res.writeHead(500, { 'content-type': 'application/json' }).end('{"object":"error","message":"gateway trouble"}');
      return;
    }
    const proxied = request({ host: upstream.hostname, port: upstream.port, method: req.method, path: url.pathname, headers: { ...req.headers, host: upstream.host } }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    });
    proxied.on('error', () => res.destroy());
    req.pipe(proxied);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, seen, failNext };
}

let harness: ServerHarness | undefined;
const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  await harness?.close();
  harness = undefined;
  for (const close of closers.splice(0)) await close();
});

const expectNoSecret = (text: string, where: string): void => {
  for (const secret of SECRETS) expect(text.includes(secret), `${secret} in ${where}: ${text.slice(0, 2000)}`).toBe(false);
};

describe('an engine URL with credentials in its query and userinfo', () => {
  it('is used with them for every request, and shown without them: ListBackends, ids, errors, logs', async () => {
    const { tokenizer } = await loadQwen3();
    const engine = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 0 });
    closers.push(() => engine.close());
    const gw = await gateway(engine.url);
    closers.push(() => new Promise<void>((resolve) => { gw.server.closeAllConnections(); gw.server.close(() => resolve()); }));
    const { logger, lines } = capturedLogger('debug');
    const secretUrl = gw.url.replace('http://', `http://op:${PASS}@`) + `/?api_key=${KEY}`;
    harness = await startServerHarness({ config: { backends: [{ url: secretUrl, maxConcurrency: 4 }] }, logger });

    // ListBackends: the url and the default id name the engine without its secrets.
    const listed = await harness.client.listBackends();
    expect(listed).toHaveLength(1);
    expect(listed[0]!.url).toBe(`${gw.url}/?api_key=***`);
    expect(listed[0]!.id).toBe(`${gw.url}/?api_key=***`);
    expect(listed[0]!.healthy).toBe(true);
    expectNoSecret(JSON.stringify(listed), 'ListBackends');

    // The requests carry them: the gateway let the server learn the model and generate.
    const pool = harness.server.runtime.deps.pool;
    const prompt = tokenizer.encode('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
    const lease = await pool.acquire('t');
    await expect(lease.generate({ promptIds: prompt, maxTokens: 8, signal: new AbortController().signal })).resolves.toMatchObject({ backendId: listed[0]!.id });
    expect(gw.seen.length).toBeGreaterThan(1);
    for (const s of gw.seen) expect(s).toEqual({ key: KEY, auth: `Basic ${Buffer.from(`op:${PASS}`).toString('base64')}` });

    // Errors naming the engine: a 500 (the caller's backend_error) and a dropped connection (logged, then retried).
    gw.failNext.push('500');
    const failed = await lease.generate({ promptIds: prompt, maxTokens: 8, signal: new AbortController().signal }).catch((err: unknown) => err);
    expect(failed).toBeInstanceOf(RolloutError);
    expect((failed as RolloutError).message).toContain(`${gw.url}/?api_key=***`);
    expectNoSecret(`${(failed as Error).message} ${String((failed as Error).cause)}`, 'the 500 error');
    gw.failNext.push('drop');
    await expect(lease.generate({ promptIds: prompt, maxTokens: 8, signal: new AbortController().signal })).resolves.toMatchObject({ finishReason: expect.any(String) });
    expect(lines.some((l) => l.includes('engine unreachable; health checked at once') && l.includes('api_key=***'))).toBe(true);
    lease.release();

    // AddBackend of another engine with secrets (nothing listens there): its id, url, errors and logs hide them too.
    const dead = await deadUrl();
    const added = await harness.client.addBackend({ url: dead.replace('http://', `http://op:${PASS2}@`) + `/gw?api_key=${KEY2}&token`, maxConcurrency: 1 }).catch((err: unknown) => err);
    expectNoSecret(added instanceof Error ? added.message : JSON.stringify(added), 'AddBackend');
    expectNoSecret(JSON.stringify(await harness.client.listBackends()), 'ListBackends after AddBackend');
    expect(lines.some((l) => l.includes('/gw?api_key=***&***'))).toBe(true); // the added engine was named, masked
    await harness.close();
    harness = undefined;
    expect(lines.length).toBeGreaterThan(0);
    expectNoSecret(lines.join('\n'), 'the server log');
  });

  it('is refused by the config and the client without echoing its secrets', () => {
    let err: unknown;
    try {
      parseConfig({ backends: [{ url: `http://op:${PASS}@127.0.0.1:1/v1?api_key=${KEY}` }] });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(RolloutError);
    expectNoSecret((err as Error).message, 'the config error');
    expect(() => new EngineHttp({ url: `ftp://op:${PASS}@host/?api_key=${KEY}`, label: 'vLLM' })).toThrow(/ftp:.*api_key=\*\*\*/);
    for (const bad of [`http://op:${PASS}@host:port/?api_key=${KEY}`, `ftp://op:${PASS}@host/?api_key=${KEY}`, `http://host/#${KEY}`]) {
      try {
        new EngineHttp({ url: bad, label: 'vLLM' });
      } catch (e) {
        expectNoSecret((e as Error).message, `the client's error for ${bad}`);
      }
    }
  });

  it('withoutCredentials masks every query value (a bare parameter whole) and a fragment; embedded URLs are settings, shown as given', () => {
    expect(withoutCredentials(`http://host:8000/?api_key=${KEY}`)).toBe('http://host:8000/?api_key=***');
    expect(withoutCredentials(`http://op:${PASS}@host:8000/base?a=1&${KEY}&&b=`)).toBe('http://host:8000/base?a=***&***&&b=***');
    expect(withoutCredentials(`https://host/#${KEY}`)).toBe('https://host/#***');
    expect(withoutCredentials(`not a url?api_key=${KEY}`)).toBe('not a url?api_key=***');
    expect(withoutCredentials('embedded://tiny-qwen3?sequences=2')).toBe('embedded://tiny-qwen3?sequences=2');
    expect(withoutCredentials('file:///models/m.gguf?threads=1')).toBe('file:///models/m.gguf?threads=1');
    // The config's default id is the shown URL.
    expect(parseConfig({ backends: [{ url: `http://host:8000/?api_key=${KEY}` }] }).backends[0]!.id).toBe('http://host:8000/?api_key=***');
  });
});
