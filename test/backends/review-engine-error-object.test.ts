import type { Server } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { EngineHttpError } from '../../src/backends/engine-http.js';
import { SglangClient } from '../../src/backends/sglang-client.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { expectRolloutError, rawServer } from '../support/engine-client-support.js';

/**
 * An engine or a gateway in front of it (LiteLLM, an API proxy) that answers HTTP 200 with an error object instead of
 * an answer. The sample fails BACKEND_ERROR either way; what matters is that the error says what the engine said (an
 * operator reading "no choices[0]" learns nothing of the out-of-memory behind it).
 */
const signal = (): AbortSignal => new AbortController().signal;

let server: Server | undefined;
afterEach(() => {
  server?.close();
  server = undefined;
});

describe('HTTP 200 carrying an error object', () => {
  const bodies: Array<[string, unknown]> = [
    ['vLLM\u2019s flat error (object: "error")', { object: 'error', message: 'CUDA out of memory. Tried to allocate 2.00 GiB', type: 'InternalServerError', param: null, code: 500 }],
    ['the nested OpenAI shape', { error: { message: 'CUDA out of memory. Tried to allocate 2.00 GiB', type: 'server_error', code: 500 } }],
    ['an error string', { error: 'CUDA out of memory. Tried to allocate 2.00 GiB' }],
  ];
  for (const [what, body] of bodies) {
    it(`${what}: backend_error naming the engine\u2019s message, its body kept as the cause (vLLM and SGLang)`, async () => {
      ({ server } = await rawServer(body, 200));
      const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
      for (const client of [new VllmClient({ url, model: 'm' }), new SglangClient({ url, model: 'm' })]) {
        const err = await expectRolloutError(client.generate({ promptIds: [1, 2, 3], maxTokens: 4, vocabSize: 100, signal: signal() }), 'backend_error');
        expect(err.message).toMatch(/answered HTTP 200 with an error: CUDA out of memory\. Tried to allocate 2\.00 GiB/);
        expect(err.cause).toBeInstanceOf(EngineHttpError);
        expect((err.cause as EngineHttpError).body).toBe(JSON.stringify(body));
        client.close();
      }
    });
  }
});
