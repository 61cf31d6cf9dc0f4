import { createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { checkCompletion, CompletionRejected } from '../../src/backends/completion.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { expectRolloutError } from '../support/engine-client-support.js';

/**
 * A TEST DOUBLE of a faulty vLLM (or a proxy in front of one) that answers the first request on a connection twice,
 * the copy late. On a keep-alive connection the HTTP client takes the copy as the answer to the next
 * request written to that connection: an answer sampled for another prompt, which must never become this
 * request's tokens. vLLM states the prompt it answered (usage.prompt_tokens: the ids it was sent).
 */
function completionFor(promptLength: number, ids: number[]): string {
  return JSON.stringify({
    id: 'cmpl-a',
    object: 'text_completion',
    model: 'm',
    choices: [{ index: 0, text: 'ab', finish_reason: 'stop', stop_reason: null, logprobs: { token_logprobs: ids.map(() => -0.5), tokens: ids.map((id) => `token_id:${id}`) } }],
    usage: { prompt_tokens: promptLength, completion_tokens: ids.length, total_tokens: promptLength + ids.length },
  });
}

const response = (body: string): string =>
  `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nkeep-alive: timeout=5\r\n\r\n${body}`;

async function duplicatingEngine(): Promise<{ url: string; server: Server; sockets: Set<Socket> }> {
  let requests = 0;
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('data', (data) => {
      for (const _ of data.toString().split('\r\n\r\n').filter((part) => part.startsWith('POST'))) {
        const n = ++requests;
        // The first request's answer (3 prompt ids) goes out twice: its copy once the next request is on the
        // connection (deterministically in flight), before that request's own answer.
        if (n === 2) socket.write(response(completionFor(3, [7, 8])));
        socket.write(response(n === 1 ? completionFor(3, [7, 8]) : completionFor(5, [9])));
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

describe('an answer delivered to the wrong request', () => {
  it('is refused: its usage.prompt_tokens is not the request\u2019s prompt, so its tokens never join this trajectory', async () => {
    engine = await duplicatingEngine();
    const client = new VllmClient({ url: engine.url, model: 'm', maxSockets: 1 });
    try {
      const first = await client.generate({ promptIds: [1, 2, 3], maxTokens: 8, vocabSize: 100, signal: signal() });
      expect(first.tokenIds).toEqual([7, 8]);
      const err = await expectRolloutError(client.generate({ promptIds: [1, 2, 3, 4, 5], maxTokens: 8, vocabSize: 100, signal: signal() }), 'backend_error');
      expect(err.message).toMatch(/usage\.prompt_tokens = 3, but the request's prompt has 5 ids/);
    } finally {
      client.close();
    }
  });

  it('checkCompletion: usage.prompt_tokens must be the prompt\u2019s length when the prompt is known; an answer with no token is exempt', () => {
    const expectation = { maxTokens: 8, vocabSize: 100, promptIds: [1, 2, 3, 4, 5] };
    expect(checkCompletion(JSON.parse(completionFor(5, [9])), expectation).tokenIds).toEqual([9]);
    expect(() => checkCompletion(JSON.parse(completionFor(3, [9])), expectation)).toThrow(CompletionRejected);
    expect(() => checkCompletion(JSON.parse(completionFor(6, [9])), expectation)).toThrow(/usage\.prompt_tokens = 6/);
    // Unknown prompt (callers that do not say), or no usage at all: not checked.
    expect(checkCompletion(JSON.parse(completionFor(3, [9])), { maxTokens: 8, vocabSize: 100 }).tokenIds).toEqual([9]);
    const noUsage = JSON.parse(completionFor(3, [9])) as Record<string, unknown>;
    delete noUsage.usage;
    expect(checkCompletion(noUsage, expectation).tokenIds).toEqual([9]);
    // An abort before any token brings nothing into the trajectory, whatever it says of its prompt.
    const aborted = JSON.parse(completionFor(3, [])) as { choices: Array<Record<string, unknown>> };
    aborted.choices[0]!.finish_reason = 'abort';
    aborted.choices[0]!.text = '';
    expect(checkCompletion(aborted, expectation).tokenIds).toEqual([]);
  });
});
