import { createServer, request, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

/** One /v1/completions exchange as it crossed the wire: what was asked and what the engine answered, verbatim. */
export interface Exchange {
  prompt: number[];
  seed: number | undefined;
  maxTokens: number | undefined;
  tokenIds: number[];
  logprobs: number[];
  finishReason: string;
}

/** A recording proxy and what it saw. */
export interface RecordingProxy {
  url: string;
  /** Every answered completion (HTTP 200), in the order the answers arrived. */
  exchanges: Exchange[];
  /** Completion requests forwarded and not answered yet. */
  inflight(): number;
  server: Server;
  close(): Promise<void>;
}

/**
 * TEST HELPER: a node:http proxy in front of an engine that forwards everything (completions, health, the pause
 * routes) and records every completion request with the engine's answer, so a test can check that each sampled
 * span of a trajectory is exactly one answer of the engine to exactly the ledger's context. When the engine cannot
 * be reached (killed), the client's connection is destroyed, as the engine's own would be.
 */
export async function recordingProxy(target: string): Promise<RecordingProxy> {
  const exchanges: Exchange[] = [];
  const upstream = new URL(target);
  let inflight = 0;
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    const completion = req.url === '/v1/completions';
    if (completion) inflight++;
    let counted = completion;
    const done = (): void => {
      if (counted) inflight--;
      counted = false;
    };
    res.on('close', done);
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const out = request({ host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers: req.headers }, (answer) => {
        const parts: Buffer[] = [];
        answer.on('data', (c: Buffer) => parts.push(c));
        answer.on('error', () => res.destroy());
        answer.on('end', () => {
          const text = Buffer.concat(parts);
          if (completion && answer.statusCode === 200) {
            const sent = JSON.parse(body.toString('utf8')) as { prompt: number[]; seed?: number; max_tokens?: number };
            const choice = (JSON.parse(text.toString('utf8')) as { choices: Array<{ finish_reason: string; logprobs: { tokens: string[]; token_logprobs: number[] } }> }).choices[0]!;
            // The client asks for return_tokens_as_token_ids: each sampled token is "token_id:<id>".
            const tokenIds = choice.logprobs.tokens.map((t) => Number(/^token_id:(\d+)$/.exec(t)?.[1] ?? NaN));
            exchanges.push({ prompt: sent.prompt, seed: sent.seed, maxTokens: sent.max_tokens, tokenIds, logprobs: choice.logprobs.token_logprobs, finishReason: choice.finish_reason });
          }
          res.writeHead(answer.statusCode ?? 502, answer.headers).end(text);
        });
      });
      out.on('error', () => res.destroy());
      out.end(body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    exchanges,
    inflight: () => inflight,
    server,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
