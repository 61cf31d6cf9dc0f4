import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { EngineHttp } from '../../src/backends/engine-http.js';
import { ResponseBudget } from '../../src/backends/response-budget.js';
import { within } from '../support/wait.js';

/**
 * A TEST DOUBLE of an engine (or a gateway in front of one: nginx and Envoy can send 103 Early Hints) whose answers are
 * preceded by an informational (1xx) response. undici reports each 1xx
 * as a response start of its own before the final one.
 */
async function informationalServer(final: { status: number; body: string }): Promise<{ url: string; server: Server }> {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeEarlyHints({ link: '</weights>; rel=preload' });
      res.writeHead(final.status, { 'content-type': 'application/json' }).end(final.body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

const signal = (): AbortSignal => new AbortController().signal;

describe('informational (1xx) responses before an engine\u2019s answer', () => {
  let server: Server | undefined;
  let http: EngineHttp | undefined;
  afterEach(async () => {
    http?.close();
    server?.closeAllConnections();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    server = undefined;
    http = undefined;
  });

  it('are skipped: the answer is the final one, and the shared budget of buffered answers gets every byte back', async () => {
    const started = await informationalServer({ status: 200, body: '{"ok":true}' });
    server = started.server;
    http = new EngineHttp({ url: started.url, label: 'vLLM', requestTimeoutMs: 5_000 });
    const budget = new ResponseBudget(1 << 20);
    // Each 1xx taken as an answer start reserved up to 64 KiB that the final answer's reservation then overwrote: 16
    // such answers held the whole 1 MiB for good, and every answer after them waited for room that never came.
    for (let i = 0; i < 40; i++) {
      const answer = await within(http.request('POST', '/v1/completions', '{}', signal(), 1 << 20, { budget }), 4_000, `answer ${i}`);
      expect(answer).toEqual({ status: 200, text: '{"ok":true}' });
      expect(budget.heldBytes).toBe(0);
    }
  });

  it('before an error answer too: its status and body are the final answer\u2019s', async () => {
    const started = await informationalServer({ status: 503, body: '{"error":"busy"}' });
    server = started.server;
    http = new EngineHttp({ url: started.url, label: 'vLLM', requestTimeoutMs: 5_000 });
    const budget = new ResponseBudget(1 << 20);
    const answer = await http.request('POST', '/v1/completions', '{}', signal(), 1 << 20, { budget });
    expect(answer).toEqual({ status: 503, text: '{"error":"busy"}' });
    expect(budget.heldBytes).toBe(0);
  });
});
