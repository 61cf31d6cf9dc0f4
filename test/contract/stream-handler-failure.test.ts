import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { defaultRegistry } from '../../src/environments/registry.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually } from '../support/wait.js';
import { capturedLogger, quickEnvironment } from '../support/test-environments.js';

// A stream handler is async and its call site cannot await it: whatever throws past its own error handling (here its
// clean-up, the session's close after a clean end) was an unhandled rejection, which ends the Node process — every
// other trainer's stream with it. (vitest fails a run with an unhandled rejection, so this test fails without the fix.)
describe('a stream handler that fails past its own error handling', () => {
  let h: ServerHarness;
  const { logger, lines: logLines } = capturedLogger('info');
  beforeAll(async () => {
    h = await startServerHarness({
      engine: { policy: () => 'done' },
      sandboxes: new NullSandboxDriver(),
      registry: defaultRegistry().register(quickEnvironment),
      logger,
    });
  });
  afterAll(async () => h?.close());

  it('is logged, and the server goes on serving other streams', async () => {
    const close = vi.spyOn(h.server.sessions, 'close').mockImplementationOnce(() => {
      throw new Error('injected failure in the session close');
    });
    const first = h.client.openSession({ sessionId: 'fails-at-close' });
    await first.submit({ taskId: 'a', environment: 'quick', numSamples: 1, instance: {} });
    const got: string[] = [];
    for await (const t of first.trajectories()) {
      got.push(`${t.taskId}#${t.sampleIndex}`);
      first.close();
    }
    expect(got).toEqual(['a#0']);
    await eventually(() => close.mock.calls.length === 1, 'the session close');
    await eventually(() => logLines.some((l) => l.includes('a stream handler failed') && l.includes('injected failure')), 'the failure logged');

    const second = h.client.openSession({ sessionId: 'after' });
    await second.submit({ taskId: 'b', environment: 'quick', numSamples: 1, instance: {} });
    for await (const t of second.trajectories()) {
      expect(t).toMatchObject({ taskId: 'b', sampleIndex: 0 });
      second.close();
    }
    close.mockRestore();
  }, 60_000);
});
