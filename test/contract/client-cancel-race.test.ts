import { afterAll, beforeAll, describe, it } from 'vitest';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';

// grpc-js creates a call's HTTP/2 stream in a promise callback after the call started, and a cancel that comes before
// that callback is not passed on to the stream: the stream reaches the server and is never reset. The TypeScript
// client's cancels (abort, leaving the trajectory loop, Watch cancel) must reach the server however soon they come.
describe('a stream the TypeScript client cancels right after opening it', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({ sandboxes: new NullSandboxDriver(), config: { watch: { maxOpen: 8 } } });
    // The channel is connected: the window is the call's own set-up, not the connection's.
    await h.client.listEnvironments();
  });
  afterAll(async () => h?.close());

  it('is cancelled on the server too: the session detaches (and can expire), not attached until the connection closes', async () => {
    const ids = Array.from({ length: 20 }, (_, i) => `at-once-${i}`);
    for (const id of ids) h.client.openSession({ sessionId: id }).abort();
    // A stream opened after them on the same connection: once the server answered it, it has read what the earlier
    // streams sent (their open, and their reset when one was sent: frames of one connection arrive in order).
    const marker = h.client.openSession({ sessionId: 'marker' });
    await marker.opened;
    marker.abort();
    const attached = (): string[] => ids.filter((id) => h.server.sessions.get(id)?.isAttached === true);
    await eventually(() => attached().length === 0, 'every session opened and cancelled to be detached on the server');
  }, 30_000);

  it('frees its Watch slot: more watches cancelled at once than watch.maxOpen, then a Watch is still served', async () => {
    for (let i = 0; i < 20; i++) h.client.watch({ statsIntervalMs: 100 }).cancel();
    await eventually(async () => {
      const w = h.client.watch({ statsIntervalMs: 100 });
      try {
        for await (const m of w) return m.kind !== undefined;
        return false;
      } catch {
        return false; // RESOURCE_EXHAUSTED while leaked watches hold every slot
      } finally {
        w.cancel();
      }
    }, 'a new Watch to be served');
  }, 30_000);
});
