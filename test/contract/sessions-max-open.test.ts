import { credentials, status, type ClientDuplexStream, type ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startRolloutServer, type RolloutServer } from '../../src/app.js';
import { silentLogger } from '../../src/observability/logger.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { RolloutServiceClient, type RolloutRequest, type RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { within } from '../support/wait.js';

type Stream = ClientDuplexStream<RolloutRequest, RolloutResponse>;

describe('sessions.maxOpen: the sessions the server holds at once', () => {
  let server: RolloutServer;
  let client: InstanceType<typeof RolloutServiceClient>;
  beforeAll(async () => {
    server = await startRolloutServer({ port: 0, backends: [], tokenWorkers: { count: 0 }, backendAcquireTimeoutMs: 120_000, sessions: { maxOpen: 3 } }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() });
    client = new RolloutServiceClient(server.address, credentials.createInsecure());
  });
  afterAll(async () => {
    client?.close();
    await server?.shutdown();
  });

  /** Opens a session on a stream of its own: its `opened`, or the status the stream ended with. */
  const open = async (sessionId: string, resume = false): Promise<{ stream: Stream; opened: boolean; error?: ServiceError }> => {
    const stream = client.rollout();
    const outcome = new Promise<{ opened: boolean; error?: ServiceError }>((resolve) => {
      stream.on('data', (r: RolloutResponse) => r.kind?.$case === 'opened' && resolve({ opened: true }));
      stream.on('error', (error: ServiceError) => resolve({ opened: false, error }));
    });
    stream.write({ kind: { $case: 'open', value: { sessionId, resume, stageEvents: false } } });
    return { stream, ...(await within(outcome, 10_000, `session ${sessionId} to open or be refused`)) };
  };

  it('one session past the bound is refused RESOURCE_EXHAUSTED naming it; resumes still work, and a freed place serves a new one', async () => {
    const held = [await open('a'), await open('b'), await open('c')];
    expect(held.every((h) => h.opened)).toBe(true);
    const refused = await open('d');
    expect(refused.opened).toBe(false);
    expect(refused.error?.code).toBe(status.RESOURCE_EXHAUSTED);
    expect(refused.error?.details).toContain('sessions.maxOpen');
    expect(server.sessions.size).toBe(3);

    // A session detached by a broken stream, owed work, is still resumable at the bound: it is one of the three.
    const accepted = new Promise<void>((resolve) => held[0]!.stream.on('data', (r: RolloutResponse) => r.kind?.$case === 'accepted' && resolve()));
    held[0]!.stream.write({ kind: { $case: 'task', value: { taskId: 'owed', environment: 'math', numSamples: 1, instance: { problem: '1+1', answer: '2' }, metadata: {} } as never } });
    await within(accepted, 10_000, 'the task to be accepted');
    held[0]!.stream.cancel();
    await within(new Promise<void>((resolve) => held[0]!.stream.on('error', () => resolve())), 10_000, 'the cancel');
    const resumed = await open('a', true);
    expect(resumed.opened).toBe(true);

    // A session closed cleanly (nothing owed) frees its place.
    const ended = new Promise<void>((resolve) => held[1]!.stream.on('status', () => resolve()));
    held[1]!.stream.end();
    await within(ended, 10_000, 'session b to close');
    const next = await open('e');
    expect(next.opened).toBe(true);
    for (const s of [resumed, held[2]!, next]) s.stream.end();
  }, 30_000);
});
