import { createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { CompletionRejected } from '../../src/backends/completion.js';
import { checkSglangGenerate } from '../../src/backends/sglang-answer.js';
import { SglangClient } from '../../src/backends/sglang-client.js';
import { expectRolloutError } from '../support/engine-client-support.js';

/**
 * A TEST DOUBLE of a faulty SGLang (or a proxy in front of one) that answers the first request on a connection twice,
 * the copy late: on a keep-alive connection the copy is read as the answer to the next request written there — tokens
 * sampled from another context. SGLang states what it answered: `meta_info.prompt_tokens` (the ids it was sent) and
 * `meta_info.id` (the request's rid; tokenizer_manager.py `_handle_batch_output`).
 */
function generateFor(rid: string, promptLength: number, ids: number[]): string {
  return JSON.stringify({
    text: 'ab',
    output_ids: ids,
    meta_info: {
      id: rid,
      finish_reason: { type: 'stop', matched: ids.at(-1) ?? 0 },
      prompt_tokens: promptLength,
      completion_tokens: ids.length,
      cached_tokens: 0,
      output_token_logprobs: ids.map((id) => [-0.5, id, null]),
    },
  });
}

const response = (body: string): string =>
  `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nkeep-alive: timeout=5\r\n\r\n${body}`;

/** Answers request 1 with `first`, and request 2 with a late copy of `first` followed by `second`. */
async function duplicatingEngine(first: string, second: string): Promise<{ url: string; server: Server; sockets: Set<Socket> }> {
  let requests = 0;
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('data', (data) => {
      for (const _ of data.toString().split('\r\n\r\n').filter((part) => part.startsWith('POST'))) {
        const n = ++requests;
        if (n === 2) socket.write(response(first));
        socket.write(response(n === 1 ? first : second));
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, sockets };
}

const signal = (): AbortSignal => new AbortController().signal;
let engine: Awaited<ReturnType<typeof duplicatingEngine>> | undefined;
afterEach(async () => {
  for (const s of engine?.sockets ?? []) s.destroy();
  await new Promise<void>((resolve) => (engine ? engine.server.close(() => resolve()) : resolve()));
  engine = undefined;
});

describe('an SGLang answer delivered to the wrong request', () => {
  it('is refused when its meta_info.prompt_tokens is not the request\u2019s prompt length: backend_error, its tokens never join the trajectory', async () => {
    engine = await duplicatingEngine(generateFor('a', 3, [7, 8]), generateFor('b', 5, [9]));
    const client = new SglangClient({ url: engine.url, model: 'm', maxSockets: 1 });
    try {
      const first = await client.generate({ promptIds: [1, 2, 3], maxTokens: 8, vocabSize: 100, signal: signal() });
      expect(first.tokenIds).toEqual([7, 8]);
      const err = await expectRolloutError(client.generate({ promptIds: [1, 2, 3, 4, 5], maxTokens: 8, vocabSize: 100, signal: signal() }), 'backend_error');
      expect(err.message).toMatch(/meta_info\.prompt_tokens = 3, but the request's prompt has 5 ids/);
    } finally {
      client.close();
    }
  });

  it('is refused when its meta_info.id is another request\u2019s rid, even with a prompt of the same length (a GRPO group\u2019s samples)', async () => {
    engine = await duplicatingEngine(generateFor('traj-0', 3, [7, 8]), generateFor('traj-1', 3, [9]));
    const client = new SglangClient({ url: engine.url, model: 'm', maxSockets: 1 });
    try {
      const first = await client.generate({ promptIds: [1, 2, 3], maxTokens: 8, vocabSize: 100, requestId: 'traj-0', signal: signal() });
      expect(first.tokenIds).toEqual([7, 8]);
      const err = await expectRolloutError(client.generate({ promptIds: [1, 2, 3], maxTokens: 8, vocabSize: 100, requestId: 'traj-1', signal: signal() }), 'backend_error');
      expect(err.message).toMatch(/meta_info\.id = "traj-0", but the request's rid is "traj-1"/);
    } finally {
      client.close();
    }
  });

  it('checkSglangGenerate: prompt_tokens and id are checked when stated and known; an answer without tokens is exempt from the count', () => {
    const expectation = { maxTokens: 8, vocabSize: 100, promptIds: [1, 2, 3, 4, 5], requestId: 'r1' };
    expect(checkSglangGenerate(JSON.parse(generateFor('r1', 5, [9])), expectation).tokenIds).toEqual([9]);
    expect(() => checkSglangGenerate(JSON.parse(generateFor('r1', 4, [9])), expectation)).toThrow(CompletionRejected);
    expect(() => checkSglangGenerate(JSON.parse(generateFor('r2', 5, [9])), expectation)).toThrow(/meta_info\.id = "r2"/);
    // Not stated, or nothing to compare with: not checked.
    const noCount = JSON.parse(generateFor('r1', 3, [9])) as { meta_info: Record<string, unknown> };
    delete noCount.meta_info.prompt_tokens;
    delete noCount.meta_info.id;
    expect(checkSglangGenerate(noCount, expectation).tokenIds).toEqual([9]);
    expect(checkSglangGenerate(JSON.parse(generateFor('other', 3, [9])), { maxTokens: 8, vocabSize: 100 }).tokenIds).toEqual([9]);
    // SGLang's abort before prefill states prompt_tokens 0 and brings no token: accepted.
    const beforePrefill = { text: '', meta_info: { id: 'r1', finish_reason: { type: 'abort', message: 'Abort before prefill' }, prompt_tokens: 0, completion_tokens: 0 } };
    expect(checkSglangGenerate(beforePrefill, expectation).tokenIds).toEqual([]);
  });
});
