import { createServer, connect, type Server, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { status } from '@grpc/grpc-js';
import { RolloutClient, TaskRejectedError, type RolloutSession } from '../../src/client/rollout-client.js';
import type { Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, mathTask } from '../support/harness.js';
import { startServerHarness, TrajectoryReader, type ServerHarness } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';
import { journalSuite } from '../support/journal-suite.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';

// Review s37: the TypeScript session was one stream - a connection reset (a proxy, a server restart) ended it with
// UNAVAILABLE and the caller had to resume by hand, tracking what it had and had not received. With `reconnectForMs`
// it re-opens the session with resume, as the Python client does. These tests break a real TCP connection between a
// real client and a real server (127.0.0.1:0) and check that each trajectory reaches the caller exactly once.

/** A TCP proxy whose connections can be reset (both sides destroyed) and which can refuse new ones for a while. */
interface ResettableProxy {
  address: string;
  /** Destroys every connection through the proxy (what a proxy restart or a server crash looks like to a client). */
  reset(): void;
  /**
   * While down, new connections are closed at once (the server unreachable); `'blackhole'`: accepted and never
   * answered (a host that vanished behind a load balancer).
   */
  setDown(down: boolean | 'blackhole'): void;
  /** Stops passing the server's bytes to the client (they are dropped): the client hears nothing more. */
  deafen(): void;
  /** Where new connections go from now on (a server restarted on another port). */
  setUpstream(address: string): void;
  close(): Promise<void>;
}

async function resettableProxy(upstream: string): Promise<ResettableProxy> {
  let target = upstream;
  const sockets = new Set<Socket>();
  let down: boolean | 'blackhole' = false;
  /** Deafens one connection each. */
  const deafs = new Set<() => void>();
  const server: Server = createServer((client) => {
    client.on('error', () => undefined);
    let deaf = false;
    deafs.add(() => void (deaf = true));
    if (down === 'blackhole') return void sockets.add(client);
    if (down) return void client.destroy();
    const up = connect(Number(target.slice(target.lastIndexOf(':') + 1)), target.slice(0, target.lastIndexOf(':')));
    up.on('error', () => undefined);
    sockets.add(client).add(up);
    client.pipe(up);
    up.on('data', (d: Buffer) => void (deaf || client.write(d)));
    const drop = (): void => {
      client.destroy();
      up.destroy();
      sockets.delete(client);
      sockets.delete(up);
    };
    client.on('close', drop);
    up.on('close', drop);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port: p } = server.address() as { port: number };
  const reset = (): void => {
    for (const s of [...sockets]) s.destroy();
    sockets.clear();
    deafs.clear();
  };
  return {
    address: `127.0.0.1:${p}`,
    reset,
    setDown: (d) => void (down = d),
    deafen: () => {
      for (const d of deafs) d();
    },
    setUpstream: (address) => void (target = address),
    close: async () => {
      reset();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(tokenLatencyMs = 0): Promise<{ h: ServerHarness; proxy: ResettableProxy; client: RolloutClient }> {
  const h = await startServerHarness({ config: { journal: { dir: null } }, engine: { tokenLatencyMs } });
  cleanups.push(() => h.close());
  const proxy = await resettableProxy(h.server.address);
  cleanups.push(() => proxy.close());
  const client = new RolloutClient(proxy.address);
  cleanups.push(() => client.close());
  return { h, proxy, client };
}

function keysOf(ts: Trajectory[]): string[] {
  return ts.map((t) => `${t.taskId}#${t.sampleIndex}`).sort();
}

describe('RolloutSession reconnect (reconnectForMs)', () => {
  const journals = journalSuite();
  it('re-opens a reset stream: trajectories received and not acked before the break are not delivered twice', async () => {
    const { h, proxy, client } = await setup();
    const session = client.openSession({ sessionId: 'reconnect-manual', autoAck: false, reconnectForMs: 60_000 });
    const reader = new TrajectoryReader(session);
    for (let i = 0; i < 4; i++) await session.submit(mathTask(`before-${i}`, 1, i));
    const first = await within(reader.take(4), 60_000, 'four trajectories');
    // Two acked (and known to have reached the server), two held unacked by the caller when the connection breaks.
    session.ack(first.slice(0, 2).map((t) => ({ taskId: t.taskId, sampleIndex: t.sampleIndex })));
    await eventually(() => h.server.sessions.get('reconnect-manual')?.unackedCount === 2, 'the server has the two acks', 30_000);
    proxy.reset();
    // A submit right after the break: written on the re-opened stream (or sent again there if the old one took it).
    const after = await within(session.submit(mathTask('after', 2, 9)), 60_000, 'the submit made across the break');
    expect(after.taskId).toBe('after');
    // The caller's acks of the two it held go on the re-opened stream.
    session.ack(first.slice(2).map((t) => ({ taskId: t.taskId, sampleIndex: t.sampleIndex })));
    const more = await within(reader.take(2), 60_000, 'the samples of the task submitted after the break');
    session.ack(more.map((t) => ({ taskId: t.taskId, sampleIndex: t.sampleIndex })));
    session.close();
    const rest = await within(reader.rest(), 30_000, 'the end of the session');
    expect(keysOf([...first, ...more, ...rest])).toEqual(['after#0', 'after#1', 'before-0#0', 'before-1#0', 'before-2#0', 'before-3#0']);
    expect(session.stats.reconnects).toBeGreaterThanOrEqual(1);
    // The server re-sent the two the caller held unacked; they were dropped here (the caller has them).
    expect(session.stats.redelivered).toBe(2);
    expect(session.stats.duplicatesDropped).toBe(2);
    // Everything acked: the server closed the session (nothing left to resume).
    await eventually(() => h.server.sessions.get('reconnect-manual') === undefined, 'the session closed on the server', 30_000);
  }, 180_000);

  it('with autoAck, a batch consumed across two resets arrives whole, each trajectory once', async () => {
    const { h, proxy, client } = await setup(2); // samples finish over a while, some across the resets
    const session = client.openSession({ sessionId: 'reconnect-auto', reconnectForMs: 60_000 });
    const want: string[] = [];
    for (let i = 0; i < 6; i++) {
      await session.submit(mathTask(`task-${i}`, 2, 100 + i));
      want.push(`task-${i}#0`, `task-${i}#1`);
    }
    const got: Trajectory[] = [];
    const consumer = (async () => {
      for await (const t of session.trajectories()) {
        got.push(t);
        if (got.length === 3 || got.length === 8) proxy.reset();
      }
    })();
    // A submit made while the stream may be down.
    await eventually(() => got.length >= 3, 'the first reset', 60_000);
    await within(session.submit(mathTask('late', 1, 200)), 60_000, 'a submit after the first reset');
    want.push('late#0');
    session.close();
    await within(consumer, 120_000, 'the whole batch');
    expect(keysOf(got)).toEqual(want.sort());
    expect(session.stats.reconnects).toBeGreaterThanOrEqual(2);
    await eventually(() => h.server.sessions.get('reconnect-auto') === undefined, 'every trajectory acked: the session closed on the server', 30_000);
  }, 240_000);

  it('resumes on a journaled server restarted behind the same address: each task\'s trajectory arrives once, completed', async () => {
    const dir = await journals.dir('rollout-s37-restart-');
    const a = await journals.server(dir, { config: { run: { concurrency: 1 } }, engine: { tokenLatencyMs: 5 } });
    const proxy = await resettableProxy(a.server.address);
    cleanups.push(() => proxy.close());
    const client = new RolloutClient(proxy.address);
    cleanups.push(() => client.close());
    const session = client.openSession({ sessionId: 'restart', reconnectForMs: 60_000 });
    for (let i = 0; i < 4; i++) await session.submit(mathTask(`r-${i}`, 1, 40 + i));
    session.close();
    const got: Trajectory[] = [];
    const consumer = (async () => {
      for await (const t of session.trajectories()) got.push(t);
    })();
    await eventually(() => got.length >= 1, 'a first trajectory', 60_000);
    proxy.setDown(true); // reconnect attempts meet a server that is not there while it restarts
    await a.close();
    const b = await journals.server(dir, { engine: { tokenLatencyMs: 0 } });
    proxy.setUpstream(b.server.address);
    proxy.setDown(false);
    await within(consumer, 120_000, 'every task, after the restart');
    expect(keysOf(got)).toEqual(['r-0#0', 'r-1#0', 'r-2#0', 'r-3#0']);
    expect(got.filter((t) => t.status !== TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED)).toEqual([]);
    expect(session.stats.reconnects).toBeGreaterThanOrEqual(1);
  }, 240_000);

  it('ends cleanly when the stream breaks after its half-close and the server has closed the session (NOT_FOUND on resume)', async () => {
    const { h, proxy, client } = await setup();
    const session = client.openSession({ sessionId: 'reconnect-after-close', reconnectForMs: 60_000 });
    const reader = new TrajectoryReader(session);
    await session.submit(mathTask('only', 1, 1));
    await within(reader.take(1), 60_000, 'the trajectory');
    // Its ack goes when the reader comes back; the server has it once it no longer holds the trajectory unacked.
    const rest = reader.rest();
    await eventually(() => h.server.sessions.get('reconnect-after-close')?.unackedCount === 0, 'the ack at the server', 30_000);
    proxy.deafen(); // the stream's final status never reaches the client
    session.close();
    await eventually(() => h.server.sessions.get('reconnect-after-close') === undefined, 'the server closed the session', 30_000);
    proxy.reset();
    await expect(within(rest, 30_000, 'the end of iteration')).resolves.toEqual([]);
    expect(session.stats.reconnects).toBeGreaterThanOrEqual(1);
  }, 60_000);

  // The server ends a stream whose client took nothing for sessions.stalledMs with RESOURCE_EXHAUSTED (and resets it
  // with RST_STREAM ENHANCE_YOUR_CALM, also RESOURCE_EXHAUSTED to grpc-js, if the client still reads nothing): the
  // session stays resumable, so that is a break to reconnect from, not the session's end.
  it('reconnects from a stream the server ended for stalling (RESOURCE_EXHAUSTED): every trajectory arrives once', async () => {
    // Long answers (~2,000 tokens each): 64 trajectories are megabytes, well past any HTTP/2 window.
    const h = await startServerHarness({ config: { journal: { dir: null }, sessions: { stalledMs: 300 } }, engine: { policy: () => `${'step '.repeat(2_000)}\\boxed{0}` } });
    cleanups.push(() => h.close());
    const client = new RolloutClient(h.server.address);
    cleanups.push(() => client.close());
    const session = client.openSession({ sessionId: 'reconnect-stalled', highWater: 1, reconnectForMs: 60_000 });
    // Enough trajectories to fill the HTTP/2 window while the consumer takes none: the server's writes block.
    const task = mathTask('stalled', 64, 5);
    task.sampling = { ...task.sampling!, maxTokensPerTurn: 4_096, maxTotalTokens: 8_192 };
    await session.submit(task);
    session.close();
    await eventually(() => (h.server.sessions.get('reconnect-stalled')?.unackedCount ?? 0) >= 32, 'the server to have sent what it could', 60_000);
    await new Promise((resolve) => setTimeout(resolve, 1_500)); // past stalledMs: the server ends the stream
    const got = await within(collect(session.trajectories()), 120_000, 'every trajectory');
    expect(keysOf(got)).toEqual(Array.from({ length: 64 }, (_, i) => `stalled#${i}`).sort());
    expect(session.stats.reconnects).toBeGreaterThanOrEqual(1);
  }, 180_000);

  it('gives up after reconnectForMs with the transport error: the iterator and a waiting submit reject, nothing hangs', async () => {
    const { proxy, client } = await setup();
    const session = client.openSession({ sessionId: 'reconnect-budget', reconnectForMs: 1_500 });
    await session.opened;
    const iteration = (async () => {
      for await (const t of session.trajectories()) void t;
    })();
    iteration.catch(() => undefined);
    proxy.setDown(true);
    proxy.reset();
    const submit = session.submit(mathTask('never-sent', 1, 1));
    submit.catch(() => undefined);
    const err = await within(iteration.then(() => undefined, (e: unknown) => e), 30_000, 'the session to fail');
    expect((err as { code?: number }).code).toBe(status.UNAVAILABLE);
    await expect(within(submit, 5_000, 'the submit to reject')).rejects.toMatchObject({ code: status.UNAVAILABLE });
    await expect(session.submit(mathTask('after-the-end', 1, 2))).rejects.toThrow(/rollout stream ended/);
  }, 60_000);

  it('bounds a re-open that is never answered (a black-holed address) by reconnectForMs too', async () => {
    const { proxy, client } = await setup();
    const session = client.openSession({ sessionId: 'reconnect-blackhole', reconnectForMs: 1_500 });
    await session.opened;
    const iteration = (async () => {
      for await (const t of session.trajectories()) void t;
    })();
    iteration.catch(() => undefined);
    proxy.setDown('blackhole');
    proxy.reset();
    // The budget is 1.5 s; grpc-js alone would wait out its 20 s connect timeout on the silent connection first.
    const err = await within(iteration.then(() => undefined, (e: unknown) => e), 12_000, 'the session to fail');
    expect((err as { code?: number }).code).toBe(status.UNAVAILABLE);
  }, 60_000);

  it('a client closed while a session waits to reconnect ends that session with an error (no throw from a timer)', async () => {
    const { proxy, client } = await setup();
    const session = client.openSession({ sessionId: 'reconnect-client-closed', reconnectForMs: 600_000 });
    await session.opened;
    const iteration = (async () => {
      for await (const t of session.trajectories()) void t;
    })();
    iteration.catch(() => undefined);
    proxy.setDown(true);
    proxy.reset();
    await eventually(() => session.stats.reconnects >= 1, 'a reconnect attempt', 30_000);
    client.close();
    const err = await within(iteration.then(() => undefined, (e: unknown) => e), 10_000, 'the session to fail');
    expect(err).toBeInstanceOf(Error);
  }, 60_000);

  it('retries a first open the server never answered as a fresh open (not a resume of a session it never had)', async () => {
    const { proxy, client } = await setup();
    proxy.setDown(true);
    const session = client.openSession({ sessionId: 'reconnect-first-open', reconnectForMs: 60_000 });
    const submitted = session.submit(mathTask('first', 1, 1));
    await eventually(() => session.stats.reconnects >= 1, 'a re-open of the first open', 30_000);
    proxy.setDown(false);
    expect((await within(session.opened, 30_000, 'the open')).sessionId).toBe('reconnect-first-open');
    await within(submitted, 30_000, 'the submit');
    session.close();
    const got = await within(collect(session.trajectories()), 60_000, 'the trajectory');
    expect(keysOf(got)).toEqual(['first#0']);
  }, 90_000);

  it('abort() while it waits to reconnect ends the iterator with CANCELLED at once', async () => {
    const { proxy, client } = await setup();
    const session = client.openSession({ sessionId: 'reconnect-abort', reconnectForMs: 600_000 });
    await session.opened;
    const iteration = (async () => {
      for await (const t of session.trajectories()) void t;
    })();
    iteration.catch(() => undefined);
    proxy.setDown(true);
    proxy.reset();
    await eventually(() => session.stats.reconnects >= 2, 'reconnect attempts against an unreachable server', 30_000);
    session.abort();
    const err = await within(iteration.then(() => undefined, (e: unknown) => e), 10_000, 'the iterator to end after abort()');
    expect((err as { code?: number }).code).toBe(status.CANCELLED);
  }, 60_000);

  it('does not reconnect when the session is gone: a resume the server refuses (NOT_FOUND) ends the session', async () => {
    const { h, proxy, client } = await setup();
    const session = client.openSession({ sessionId: 'reconnect-gone', reconnectForMs: 60_000 });
    await session.opened;
    const iteration = (async () => {
      for await (const t of session.trajectories()) void t;
    })();
    iteration.catch(() => undefined);
    proxy.setDown(true);
    proxy.reset();
    // The server forgets the detached session (as when it expired).
    await eventually(() => h.server.sessions.get('reconnect-gone')?.isAttached === false, 'the session detached on the server', 30_000);
    h.server.sessions.close(h.server.sessions.get('reconnect-gone')!);
    proxy.setDown(false);
    const err = await within(iteration.then(() => undefined, (e: unknown) => e), 30_000, 'the session to fail');
    expect((err as { code?: number }).code).toBe(status.NOT_FOUND);
  }, 60_000);

  it('off by default: a reset ends the session with UNAVAILABLE, as before', async () => {
    const { proxy, client } = await setup();
    const session: RolloutSession = client.openSession({ sessionId: 'no-reconnect' });
    await session.opened;
    const iteration = (async () => {
      for await (const t of session.trajectories()) void t;
    })();
    iteration.catch(() => undefined);
    proxy.reset();
    const err = await within(iteration.then(() => undefined, (e: unknown) => e), 30_000, 'the session to fail');
    expect((err as { code?: number }).code).toBe(status.UNAVAILABLE);
    expect(session.stats.reconnects).toBe(0);
  }, 60_000);

  it('refuses a bad reconnectForMs by name', () => {
    const client = new RolloutClient('127.0.0.1:1');
    cleanups.push(() => client.close());
    expect(() => client.openSession({ reconnectForMs: -1 })).toThrow(/reconnectForMs/);
  });
});

describe('a spec over the channel\'s maxSendMessageBytes', () => {
  it('is refused alone by submit(), naming its largest field; the stream and the other tasks go on', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null } } });
    cleanups.push(() => h.close());
    const client = new RolloutClient(h.server.address, { maxSendMessageBytes: 4096 });
    cleanups.push(() => client.close());
    const session = client.openSession({ sessionId: 'too-big' });
    const reader = new TrajectoryReader(session);
    await session.submit(mathTask('small-1', 1, 1));
    const big = mathTask('big', 1, 2, { instance: { problem: 'x'.repeat(8000), answer: '1' } });
    const refusal = await session.submit(big).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(refusal).toBeInstanceOf(TaskRejectedError);
    const e = refusal as TaskRejectedError;
    expect([e.taskId, e.field, e.code, e.retryable]).toEqual(['big', 'instance', status.INVALID_ARGUMENT, false]);
    expect(e.reason).toMatch(/over the 4096-byte limit.*maxSendMessageBytes/);
    await session.submit(mathTask('small-2', 1, 3));
    session.close();
    const all = await within(reader.rest(), 60_000, 'the other tasks');
    expect(keysOf(all)).toEqual(['small-1#0', 'small-2#0']);
  }, 60_000);
});
