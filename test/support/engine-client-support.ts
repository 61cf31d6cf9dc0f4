import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { expect } from 'vitest';
import { RolloutError } from '../../src/errors.js';

/** Awaits a promise that must reject with a RolloutError of `code`, and returns that error. */
export async function expectRolloutError(promise: Promise<unknown>, code: string): Promise<RolloutError> {
  const err = await promise.then(
    () => expect.fail('expected a RolloutError'),
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RolloutError);
  expect((err as RolloutError).code).toBe(code);
  return err as RolloutError;
}

/**
 * A one-route HTTP server on 127.0.0.1 answering every request with `body` (JSON unless a string) and `status`: an
 * engine double for answers the fake engines never give. The caller closes `server`.
 */
export async function rawServer(body: unknown, status = 200): Promise<{ url: string; server: Server }> {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  const server = createServer((_req, res) => res.writeHead(status, { 'content-type': 'application/json' }).end(text));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}
