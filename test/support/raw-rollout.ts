import { Client, credentials } from '@grpc/grpc-js';
import { RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';

export interface RawRollout {
  client: Client;
  /** Writes one request's bytes as they are (no stub validates them). */
  send(bytes: Uint8Array): void;
  /** Half-closes the request side. */
  end(): void;
  /** Cancels the call (a client that goes away without acking). */
  cancel(): void;
  /** Every response, once the server ends the stream. */
  responses: Promise<RolloutResponse[]>;
  /** Responses received so far. */
  received: RolloutResponse[];
  /** The call's final status code. */
  status: Promise<number>;
}

/** A raw Rollout stream: requests are bytes, answers are decoded, so a test can send what no stub would. */
export function rawRollout(address: string): RawRollout {
  const client = new Client(address, credentials.createInsecure());
  const call = client.makeBidiStreamRequest(
    '/rollout.v1.RolloutService/Rollout',
    (bytes: Uint8Array) => Buffer.from(bytes),
    (bytes: Buffer) => RolloutResponse.decode(bytes),
  );
  const received: RolloutResponse[] = [];
  call.on('data', (r: RolloutResponse) => received.push(r));
  const status = new Promise<number>((resolve) => call.on('status', (s: { code: number }) => resolve(s.code)));
  const responses = new Promise<RolloutResponse[]>((resolve) => {
    call.on('end', () => resolve(received));
    call.on('error', () => resolve(received));
  });
  return { client, send: (bytes) => call.write(bytes), end: () => call.end(), cancel: () => call.cancel(), responses, received, status };
}
