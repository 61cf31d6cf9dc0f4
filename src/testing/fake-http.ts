import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** TEST DOUBLE helpers shared by the fake engines' HTTP servers. */

export const OK_JSON = { 'content-type': 'application/json' };

/** Starts an HTTP server on 127.0.0.1 on a free port; resolves with it and its base URL. */
export async function listenLocal(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ server: Server; url: string }> {
  const server = createServer(handler);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

/** Stops a server and drops every open connection (hanging requests included). */
export async function closeServer(server: Server): Promise<void> {
  const closed = new Promise<void>((resolve) => server.close(() => resolve()));
  server.closeAllConnections();
  await closed;
}

/** The request body parsed as JSON; undefined for an empty body; throws on anything else. */
export async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const text = Buffer.concat(chunks).toString('utf8');
  return text.trim() === '' ? undefined : (JSON.parse(text) as unknown);
}

/**
 * Streams a 200 answer of `bytes` bytes that starts with `prefix` and never ends being valid JSON: a 64 KiB chunk
 * reused for every write, written only as fast as the client reads (backpressure), abandoned when it goes away.
 * `sent` is told every piece written.
 */
export function streamOversized(res: ServerResponse, bytes: number, prefix: string, sent: (n: number) => void): void {
  const chunk = Buffer.alloc(64 * 1024, 0x20);
  Buffer.from(prefix).copy(chunk);
  let left = bytes;
  res.writeHead(200, OK_JSON);
  const pump = (): void => {
    while (left > 0 && !res.destroyed) {
      const piece = left >= chunk.length ? chunk : chunk.subarray(0, left);
      left -= piece.length;
      sent(piece.length);
      if (!res.write(piece)) return void res.once('drain', pump);
    }
    if (!res.destroyed) res.end();
  };
  res.on('error', () => undefined);
  pump();
}
