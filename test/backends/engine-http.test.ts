import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { EngineHttp, withoutCredentials } from '../../src/backends/engine-http.js';
import { RolloutError } from '../../src/errors.js';

const signal = (): AbortSignal => new AbortController().signal;

/**
 * An engine stand-in that counts connections, notes each request's body framing headers and echoes the request body;
 * `keepAliveMs` is its idle-close timeout.
 */
async function countingServer(
  keepAliveMs: number,
): Promise<{ url: string; server: Server; connections: () => number; framing: { contentLength?: string; transferEncoding?: string }[] }> {
  let connections = 0;
  const framing: { contentLength?: string; transferEncoding?: string }[] = [];
  const server = createServer((req, res) => {
    framing.push({
      ...(req.headers['content-length'] !== undefined && { contentLength: req.headers['content-length'] }),
      ...(req.headers['transfer-encoding'] !== undefined && { transferEncoding: req.headers['transfer-encoding'] }),
    });
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(Buffer.concat(chunks)));
  });
  server.keepAliveTimeout = keepAliveMs;
  server.on('connection', () => connections++);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, connections: () => connections, framing };
}

describe('EngineHttp (undici pool per engine)', () => {
  let server: Server | undefined;
  let http: EngineHttp | undefined;
  afterEach(async () => {
    http?.close();
    server?.closeAllConnections();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    server = undefined;
    http = undefined;
  });

  it('reuses keep-alive connections for requests one after another (not one per request), and sends a body in pieces as one JSON text', async () => {
    const s = await countingServer(5_000);
    server = s.server;
    http = new EngineHttp({ url: s.url, label: 'test engine' });
    for (let i = 0; i < 10; i++) {
      // Text pieces and byte pieces (a long prompt's JSON as its token thread wrote it), in one body.
      const bytes = new TextEncoder().encode(`[[1,2,${i}]]`).subarray(1, -1);
      const answer = await http.request('POST', '/echo', ['{"prompt":', '[1,2', `,${i}]`, ',"é":1,"b":', bytes, '}'], signal(), 1 << 20);
      expect(answer).toEqual({ status: 200, text: `{"prompt":[1,2,${i}],"é":1,"b":[1,2,${i}]}` });
    }
    // undici's pool marks a connection free a tick after its answer ends, so a request sent at once from the answer's
    // continuation opens a second one; from then on the two are reused, never one connection per request.
    expect(s.connections()).toBeLessThanOrEqual(2);
  });

  it('writes a long prompt\'s JSON bytes into the body as they are: the same text, with a content-length, not chunked', async () => {
    const s = await countingServer(5_000);
    server = s.server;
    http = new EngineHttp({ url: s.url, label: 'test engine' });
    const ids = Array.from({ length: 30_000 }, (_, i) => (i * 7919) % 151_936);
    const json = new TextEncoder().encode(JSON.stringify(ids));
    expect(json.length).toBeGreaterThan(64 * 1024);
    const before = Buffer.from(json);
    for (let i = 0; i < 3; i++) {
      // The ledger's pieces: text, the prompt's bytes without their brackets (a view), then the new ids and the rest.
      const pieces = ['{"prompt":[', json.subarray(1, json.length - 1), `,${i}]`, ',"é":1}'];
      const answer = await http.request('POST', '/echo', pieces, signal(), 1 << 20);
      const expected = `{"prompt":${JSON.stringify([...ids, i])},"é":1}`;
      expect(answer.status).toBe(200);
      expect(answer.text === expected).toBe(true);
      expect(s.framing.at(-1)).toEqual({ contentLength: String(Buffer.byteLength(expected)) });
    }
    expect(Buffer.from(json).equals(before)).toBe(true);
    expect(s.connections()).toBeLessThanOrEqual(2);
  });

  it('never sends a request into a connection the engine is closing as idle (requests spaced at its keep-alive timeout all succeed)', async () => {
    // Node's server announces `Keep-Alive: timeout=1`; undici retires idle connections before that, so no request
    // races the engine's close (node:http's agent wrote into such sockets: ECONNRESET on a loaded machine).
    const s = await countingServer(1_000);
    server = s.server;
    http = new EngineHttp({ url: s.url, label: 'test engine' });
    for (let i = 0; i < 4; i++) {
      await expect(http.request('GET', '/x', undefined, signal(), 1024)).resolves.toMatchObject({ status: 200 });
      await sleep(1_000);
    }
  });

  it('an abort while the request waits for a connection settles at once with the caller\'s reason', async () => {
    const hanging = createServer(() => undefined);
    server = hanging;
    await new Promise<void>((resolve) => hanging.listen(0, '127.0.0.1', resolve));
    http = new EngineHttp({ url: `http://127.0.0.1:${(hanging.address() as AddressInfo).port}`, label: 'test engine', maxSockets: 1 });
    const first = http.request('GET', '/a', undefined, signal(), 1024).catch((e: unknown) => e);
    const controller = new AbortController();
    const queued = http.request('GET', '/b', undefined, controller.signal, 1024);
    controller.abort(new Error('caller gave up'));
    const err = await queued.then(() => expect.fail('expected a rejection'), (e: unknown) => e);
    expect(err).toBeInstanceOf(RolloutError);
    expect((err as RolloutError).code).toBe('cancelled');
    http.close();
    expect(await first).toBeInstanceOf(RolloutError);
  });
});

describe('EngineHttp: credentials in the URL', () => {
  let server: Server | undefined;
  let http: EngineHttp | undefined;
  afterEach(async () => {
    http?.close();
    server?.closeAllConnections();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    server = undefined;
    http = undefined;
  });

  /** An engine stand-in that answers each request with its path and authorization header (`status` as asked). */
  async function recordingServer(status = 200): Promise<string> {
    const s = createServer((req, res) => res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify({ path: req.url, authorization: req.headers.authorization ?? null })));
    server = s;
    await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
    return `127.0.0.1:${(s.address() as AddressInfo).port}`;
  }

  it('withoutCredentials drops user and password, masks query values, keeps the rest as given, and leaves a URL with nothing to hide unchanged', () => {
    expect(withoutCredentials('http://user:pass@host:8000')).toBe('http://host:8000');
    expect(withoutCredentials('http://user:pass@host:8000/')).toBe('http://host:8000/');
    expect(withoutCredentials('https://token@host/base/?q=1')).toBe('https://host/base/?q=***'); // query values are masked too
    expect(withoutCredentials('http://:pass@host')).toBe('http://host');
    expect(withoutCredentials('http://a@b:c@host/')).toBe('http://host/');
    expect(withoutCredentials('http://host:8000')).toBe('http://host:8000');
    expect(withoutCredentials('HTTP://Host:8000/')).toBe('HTTP://Host:8000/');
    // Not a URL (refused elsewhere): what looks like userinfo still goes.
    expect(withoutCredentials('http://user:pass@host:notaport')).toBe('http://host:notaport');
  });

  it('sends the userinfo as basic auth (percent-decoded, as curl does) and shows the URL without it', async () => {
    const hostPort = await recordingServer();
    http = new EngineHttp({ url: `http://operator:s3cret%40pass@${hostPort}/base/`, label: 'test engine' });
    expect(http.url).toBe(`http://${hostPort}/base`);
    const answer = JSON.parse((await http.request('GET', '/v1/models', undefined, signal(), 1024)).text) as unknown;
    expect(answer).toEqual({ path: '/base/v1/models', authorization: `Basic ${Buffer.from('operator:s3cret@pass').toString('base64')}` });
  });

  it('sends a user without a password as "user:" and nothing without userinfo', async () => {
    const hostPort = await recordingServer();
    http = new EngineHttp({ url: `http://token-as-user@${hostPort}`, label: 'test engine' });
    expect(http.url).toBe(`http://${hostPort}`);
    expect(JSON.parse((await http.request('GET', '/x', undefined, signal(), 1024)).text)).toMatchObject({ authorization: `Basic ${Buffer.from('token-as-user:').toString('base64')}` });
    http.close();
    http = new EngineHttp({ url: `http://${hostPort}`, label: 'test engine' });
    expect(JSON.parse((await http.request('GET', '/x', undefined, signal(), 1024)).text)).toMatchObject({ authorization: null });
  });

  it('an explicit authorization header of a request wins over the URL\'s', async () => {
    const hostPort = await recordingServer();
    http = new EngineHttp({ url: `http://operator:pass@${hostPort}`, label: 'test engine' });
    const answer = await http.request('GET', '/x', undefined, signal(), 1024, { headers: { Authorization: 'Bearer api-key' } });
    expect(JSON.parse(answer.text)).toMatchObject({ authorization: 'Bearer api-key' });
  });

  it('keeps the password out of its error messages (unreachable, timed out, oversized, control calls)', async () => {
    const messages: string[] = [];
    const failure = async (p: Promise<unknown>): Promise<void> => {
      const err = await p.then(() => expect.fail('expected a rejection'), (e: unknown) => e);
      expect(err).toBeInstanceOf(RolloutError);
      messages.push((err as Error).message);
    };
    // Unreachable: a port where nothing listens.
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const deadPort = (closed.address() as AddressInfo).port;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const dead = new EngineHttp({ url: `http://operator:s3cret-pass@127.0.0.1:${deadPort}`, label: 'test engine' });
    await failure(dead.request('GET', '/x', undefined, signal(), 1024));
    dead.close();
    // Oversized answer and a refused control call.
    const hostPort = await recordingServer(500);
    http = new EngineHttp({ url: `http://operator:s3cret-pass@${hostPort}`, label: 'test engine', requestTimeoutMs: 5_000 });
    await failure(http.control('/pause', undefined, signal()));
    const ok = new EngineHttp({ url: `http://operator:s3cret-pass@${hostPort}`, label: 'test engine' });
    server!.removeAllListeners('request');
    server!.on('request', (_req, res) => res.writeHead(200).end('x'.repeat(4096)));
    await failure(ok.request('GET', '/big', undefined, signal(), 16));
    ok.close();
    // Timed out: the engine never answers.
    server!.removeAllListeners('request');
    const slow = new EngineHttp({ url: `http://operator:s3cret-pass@${hostPort}`, label: 'test engine', requestTimeoutMs: 50 });
    await failure(slow.request('GET', '/slow', undefined, signal(), 1024));
    slow.close();
    expect(messages).toHaveLength(4);
    for (const message of messages) {
      expect(message).toContain(`http://127.0.0.1:`);
      expect(message).not.toContain('s3cret-pass');
      expect(message).not.toContain('operator');
    }
  });
});
