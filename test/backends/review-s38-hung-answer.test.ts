import type { Server, ServerResponse } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { EngineUnreachableError } from '../../src/backends/engine-http.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { parkingServer } from '../support/parking-engine.js';
import { eventually, within } from '../support/wait.js';

// A vLLM (or proxy) that sends a non-streamed completion's headers and then not one byte of its body — declared
// length or chunked — is a stall that backendBodyIdleTimeoutMs bounds, not only backendRequestTimeoutMs (300 s): the
// idle clock starts at the headers, not at the first body byte. (review-s36-body-idle covers a body that stops after
// some bytes, and a long generation — no headers yet — being left alone: vLLM sends a non-streamed answer's headers only
// once it is done, so silence before them cannot be told from a long generation.) The engine is a raw HTTP server
// parking each request until the test answers it (a test double), driven through the real vLLM client.

const signal = (): AbortSignal => new AbortController().signal;

describe('a vLLM completion whose headers came and then no body byte at all', () => {
  const servers: Server[] = [];
  const clients: VllmClient[] = [];
  afterEach(async () => {
    for (const c of clients.splice(0)) c.close();
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      await new Promise<void>((resolve) => s.close(() => resolve()));
    }
  });

  async function stalled(headers: Record<string, string>): Promise<unknown> {
    const { url, server, parked } = await parkingServer();
    servers.push(server);
    const client = new VllmClient({ url, model: 'm', requestTimeoutMs: 600_000, bodyIdleTimeoutMs: 300 });
    clients.push(client);
    const answer = client.generate({ promptIds: [1, 2, 3], maxTokens: 8, vocabSize: 100, signal: signal() }).catch((err: unknown) => err);
    await eventually(() => parked.length === 1, 'the request at the engine');
    const res: ServerResponse = parked[0]!;
    res.writeHead(200, headers);
    res.flushHeaders();
    return within(answer, 30_000, 'the stalled answer to fail');
  }

  it('with a content-length: fails as unreachable after bodyIdleTimeoutMs (0 bytes of body), not the request timeout', async () => {
    const err = await stalled({ 'content-type': 'application/json', 'content-length': '500' });
    expect(err).toBeInstanceOf(EngineUnreachableError);
    expect((err as Error).message).toMatch(/sent the headers of its POST \/v1\/completions answer \(HTTP 200\), then nothing for 300 ms \(0 bytes of body\)/);
  });

  it('chunked: the same', async () => {
    const err = await stalled({ 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    expect(err).toBeInstanceOf(EngineUnreachableError);
    expect((err as Error).message).toMatch(/then nothing for 300 ms \(0 bytes of body\)/);
  });
});
