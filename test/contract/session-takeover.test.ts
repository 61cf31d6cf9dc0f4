import { createServer, connect, type Server, type Socket } from 'node:net';
import { status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutClient } from '../../src/client/rollout-client.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';
import { capturedLogger, quickEnvironment } from '../support/test-environments.js';

const task = (taskId: string, numSamples = 1) => ({ taskId, environment: 'quick', numSamples, instance: {} });

/**
 * A TCP proxy that can freeze: it stops reading and writing both ways while keeping both sockets open, as a
 * trainer node that lost power (or a NAT that forgot the flow) looks to the server: no FIN, no RST, no answers.
 */
async function freezableProxy(target: string): Promise<{ address: string; freeze: () => void; close: () => Promise<void> }> {
  const [host, port] = [target.slice(0, target.lastIndexOf(':')), Number(target.slice(target.lastIndexOf(':') + 1))];
  const sockets: Socket[] = [];
  let frozen = false;
  const server: Server = createServer((inbound) => {
    const outbound = connect(port, host);
    sockets.push(inbound, outbound);
    for (const [from, to] of [
      [inbound, outbound],
      [outbound, inbound],
    ] as const) {
      from.on('data', (chunk) => {
        if (!frozen) to.write(chunk);
      });
      from.on('error', () => to.destroy());
      from.on('close', () => to.destroy());
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port: proxyPort } = server.address() as { port: number };
  return {
    address: `127.0.0.1:${proxyPort}`,
    freeze: () => {
      frozen = true;
      for (const s of sockets) s.pause();
    },
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

describe('sessions cannot be locked out', () => {
  let h: ServerHarness;
  const { logger, lines: logLines } = capturedLogger('debug');
  beforeAll(async () => {
    h = await startServerHarness({
      engine: { policy: () => 'done', tokenLatencyMs: 5 },
      sandboxes: new NullSandboxDriver(),
      registry: defaultRegistry().register(quickEnvironment),
      logger,
      // Fast keepalive so a half-open connection is found within a second.
      config: { keepalive: { timeMs: 300, timeoutMs: 300 } },
    });
  });
  afterAll(async () => h?.close());

  it('resume takes a session over from a stale stream: the old stream ends ABORTED, the new one gets every unacked trajectory', async () => {
    const old = h.client.openSession({ sessionId: 'take-me', autoAck: false });
    await old.submit(task('to-a', 3));
    await old.submit(task('to-b', 3));
    const seenOld: string[] = [];
    const oldEnd = (async () => {
      for await (const t of old.trajectories()) {
        seenOld.push(`${t.taskId}#${t.sampleIndex}`);
        // Acks the first one only: the rest are unacked when the session is taken over.
        if (seenOld.length === 1) old.ack([{ taskId: t.taskId, sampleIndex: t.sampleIndex }]);
      }
    })().then(
      () => undefined,
      (err: unknown) => err,
    );
    await eventually(() => seenOld.length === 6, 'the old stream to receive every trajectory', 30_000);
    await eventually(() => h.server.sessions.get('take-me')!.unackedCount === 5, 'the first ack to land');

    const fresh = h.client.openSession({ sessionId: 'take-me', resume: true });
    const opened = await fresh.opened;
    expect(opened.tookOver).toBe(true);
    const oldErr = (await within(oldEnd, 10_000, 'the old stream to end')) as { code?: number; details?: string };
    expect(oldErr.code).toBe(status.ABORTED);
    expect(oldErr.details).toContain('resumed on another stream');

    fresh.close();
    const seenNew: string[] = [];
    for await (const t of fresh.trajectories()) seenNew.push(`${t.taskId}#${t.sampleIndex}`);
    const all = ['to-a#0', 'to-a#1', 'to-a#2', 'to-b#0', 'to-b#1', 'to-b#2'];
    // At least once until acked: the five unacked come again (once each), the acked one does not.
    expect(opened.redelivered).toBe(5);
    expect(seenNew.sort()).toEqual(all.filter((k) => k !== seenOld[0]));
  }, 60_000);

  it('breaking out of the trajectory loop cancels the call: the server sees it at once and the session stays resumable', async () => {
    const session = h.client.openSession({ sessionId: 'break-out' });
    await session.submit(task('bo-a', 4));
    let taken = 0;
    for await (const t of session.trajectories()) {
      expect(t.taskId).toBe('bo-a');
      if (++taken === 1) break;
    }
    // The server observes the cancellation (no half-close was sent, no idle timeout can explain it).
    await eventually(() => logLines.some((l) => l.includes('stream cancelled or broken by the client') && l.includes('break-out')), 'the server to see the cancel');
    await eventually(() => h.server.sessions.get('break-out')?.isAttached === false, 'the session to be detached');

    const again = h.client.openSession({ sessionId: 'break-out', resume: true });
    const opened = await again.opened;
    expect(opened.tookOver).toBe(false);
    again.close();
    const rest: string[] = [];
    for await (const t of again.trajectories()) rest.push(`${t.taskId}#${t.sampleIndex}`);
    // The one the loop broke on was never acked (its processing may not have finished): it comes again.
    expect(rest.sort()).toEqual(['bo-a#0', 'bo-a#1', 'bo-a#2', 'bo-a#3']);
  }, 60_000);

  it('a throw inside the loop and an explicit return() cancel the call too', async () => {
    for (const how of ['throw', 'return'] as const) {
      const id = `leave-${how}`;
      const session = h.client.openSession({ sessionId: id });
      await session.submit(task(`${id}-t`, 2));
      const iterator = session.trajectories();
      if (how === 'throw') {
        await expect(
          (async () => {
            for await (const _t of iterator) throw new Error('trainer bug');
          })(),
        ).rejects.toThrow('trainer bug');
      } else {
        await iterator.next();
        await iterator.return(undefined);
      }
      await eventually(() => logLines.some((l) => l.includes('stream cancelled or broken by the client') && l.includes(id)), `the server to see ${how}`);
      await eventually(() => h.server.sessions.get(id)?.isAttached === false, `${id} to be detached`);
    }
  }, 60_000);

  it('keepalive finds a half-open connection: its session is detached and resumes without a takeover', async () => {
    const proxy = await freezableProxy(h.server.address);
    const viaProxy = new RolloutClient(proxy.address);
    try {
      const session = viaProxy.openSession({ sessionId: 'half-open' });
      await session.submit(task('ho-a', 2));
      session.onDeliveryPaused = undefined;
      await eventually(() => h.server.sessions.get('half-open')?.isAttached === true, 'the session to attach');
      proxy.freeze(); // the trainer's node is gone, but no FIN or RST reaches the server
      // keepalive 300 ms + 300 ms timeout: generous bound, not a timing assertion.
      await eventually(() => h.server.sessions.get('half-open')?.isAttached === false, 'keepalive to drop the half-open connection', 15_000);

      const back = h.client.openSession({ sessionId: 'half-open', resume: true });
      const opened = await back.opened;
      expect(opened.tookOver).toBe(false);
      back.close();
      const got: string[] = [];
      for await (const t of back.trajectories()) got.push(`${t.taskId}#${t.sampleIndex}`);
      expect(got.sort()).toEqual(['ho-a#0', 'ho-a#1']);
    } finally {
      viaProxy.close();
      await proxy.close();
    }
  }, 60_000);
});
