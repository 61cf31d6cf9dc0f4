import { afterEach, describe, expect, it } from 'vitest';
import { Server as GrpcServer, ServerCredentials, status, type ServerDuplexStream } from '@grpc/grpc-js';
import { RolloutClient, RolloutSession, type TaskLostError } from '../../src/client/rollout-client.js';
import { RecentKeys } from '../../src/client/recent-keys.js';
import { RolloutServiceService, SessionOpened, TrajectoryStatus, type RolloutRequest, type RolloutResponse, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { segmentSeed } from '../../src/pipeline/seeds.js';
import { startServerHarness, TrajectoryReader, type ServerHarness, type ServerHarnessOptions } from '../support/server-harness.js';
import { proxyTo, type Proxy } from '../support/tcp-proxy.js';
import { eventually, within } from '../support/wait.js';

// Review s38 of the TypeScript client's reconnect (reconnectForMs): a real server on 127.0.0.1:0 behind a TCP proxy
// (a test double of the network between them) that can reset its connections, refuse new ones, log when a client
// tries to connect, and drop what the client sends (an ack lost with the stream).

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(engine: ServerHarnessOptions['engine'] = {}): Promise<{ h: ServerHarness; proxy: Proxy; client: RolloutClient }> {
  const h = await startServerHarness({ config: { journal: { dir: null } }, engine });
  cleanups.push(() => h.close());
  const proxy = await proxyTo(h.server.address);
  cleanups.push(() => proxy.close());
  const client = new RolloutClient(proxy.address);
  cleanups.push(() => client.close());
  return { h, proxy, client };
}

function keysOf(ts: Trajectory[]): string[] {
  return ts.map((t) => `${t.taskId}#${t.sampleIndex}`).sort();
}

function refsOf(ts: Trajectory[]): { taskId: string; sampleIndex: number }[] {
  return ts.map((t) => ({ taskId: t.taskId, sampleIndex: t.sampleIndex }));
}

describe('RecentKeys (the keys a reconnecting stream remembers)', () => {
  it('never holds more than its cap, forgetting the oldest first', () => {
    const keys = new RecentKeys(3);
    for (let i = 0; i < 10; i++) {
      keys.add(`k${i}`);
      expect(keys.size).toBeLessThanOrEqual(3);
    }
    expect([...keys]).toEqual(['k7', 'k8', 'k9']);
    expect(keys.has('k6')).toBe(false);
    keys.add('k8'); // known already: nothing forgotten
    expect([...keys]).toEqual(['k7', 'k8', 'k9']);
  });

  it('refuses a cap that is not a positive integer', () => {
    expect(() => new RecentKeys(0)).toThrow(/positive integer/);
  });
});

describe('RolloutSession reconnect, review s38', () => {
  it('drops a re-sent trajectory whose ack was lost with the stream while it is remembered, and remembers at most the cap', async () => {
    const { h, proxy, client } = await setup();
    // A cap of 4 (instead of 65,536): the five trajectories of this test overflow it.
    const session = new RolloutSession(client.rollout, { sessionId: 's38-seen', autoAck: false, reconnectForMs: 60_000 }, undefined, { maxRememberedKeys: 4 });
    const memory = (): number => (session as unknown as { seen: RecentKeys }).seen.size;
    const reader = new TrajectoryReader(session);
    for (let i = 0; i < 5; i++) await session.submit(mathTask(`seen-${i}`, 1, i));
    const first = await within(reader.take(5), 60_000, 'five trajectories');
    expect(memory()).toBe(4); // five received, the oldest forgotten
    // The last three are acked, but the acks never reach the server: it re-sends them after the break.
    await eventually(() => h.server.sessions.get('s38-seen')?.unackedCount === 5, 'five unacked at the server', 30_000);
    proxy.muteClient();
    const late = first.slice(2);
    session.ack(refsOf(late));
    // The two not acked are acked on the re-opened stream.
    proxy.reset();
    await eventually(() => session.stats.redelivered >= 5, 'the re-sent trajectories', 60_000);
    session.ack(refsOf(first.slice(0, 2)));
    session.close();
    const rest = await within(reader.rest(), 60_000, 'the end of the session');
    // The three acked ones came again and were recognised as received (within memory): dropped, acked again.
    expect(keysOf(rest)).toEqual([]);
    expect(session.stats.duplicatesDropped).toBe(5);
    expect(memory()).toBeLessThanOrEqual(4);
    await eventually(() => h.server.sessions.get('s38-seen') === undefined, 'everything acked: the session closed on the server', 30_000);
  }, 120_000);

  it('reaches a server back within a short budget: grpc-js\'s own reconnect backoff (up to 120 s) is bounded', async () => {
    const { proxy, client } = await setup();
    const session = client.openSession({ sessionId: 's38-backoff', reconnectForMs: 45_000 });
    await session.opened;
    const iteration = (async () => {
      for await (const t of session.trajectories()) void t;
    })();
    iteration.catch(() => undefined);
    proxy.setDown(true);
    const downAt = performance.now();
    proxy.reset();
    // 30 s unreachable: grpc-js's default backoff (1 s growing 1.6x, jittered) waits 10 s and more between attempts
    // by then, so a server back at 30 s could be tried again only after the 45 s budget.
    await new Promise((resolve) => setTimeout(resolve, 30_000));
    const upAt = performance.now();
    proxy.setDown(false);
    const seen = [downAt, ...proxy.attempts.filter((t) => t > downAt && t < upAt), upAt];
    const longestGap = Math.max(...seen.slice(1).map((t, i) => t - seen[i]!));
    // Bounded at 2 s (jittered by 20%): generous against a loaded machine; unbounded, the gaps here were 8-10 s.
    expect(longestGap).toBeLessThan(6_000);
    // Fails (UNAVAILABLE) if the session spent its budget before it reached the server again.
    await within(session.submit(mathTask('after-outage', 1, 1)), 60_000, 'a submit once the server is back');
    session.close();
    await within(iteration, 60_000, 'the end of the session');
    expect(session.stats.reconnects).toBeGreaterThanOrEqual(1);
  }, 180_000);

  it('resubmitLostTasks: a session gone on re-open (NOT_FOUND) goes on afresh; an untouched task is submitted again, a partial one is lost alone', async () => {
    // The first sample of `fresh` and the second of `partial` take 5 s at the engine: they are running when the
    // session is lost. The rest answers at once.
    // (Engine seeds are per sample and turn: task seeds far apart keep them apart.)
    const slowSeeds = new Set([0, 1].flatMap((turn) => [segmentSeed(300, 0, turn, 0), segmentSeed(200, 1, turn, 0)]));
    const { h, proxy, client } = await setup({ requestLatencyMs: ({ body }) => (slowSeeds.has(body.seed as number) ? 5_000 : 0) });
    const session = client.openSession({ sessionId: 's38-lost', reconnectForMs: 60_000, resubmitLostTasks: true });
    const lost: TaskLostError[] = [];
    session.onTaskLost = (e) => lost.push(e);
    const reader = new TrajectoryReader(session);
    await session.submit(mathTask('done', 1, 100));
    await session.submit(mathTask('partial', 2, 200));
    await session.submit(mathTask('fresh', 1, 300));
    const first = await within(reader.take(2), 60_000, 'the fast samples');
    expect(keysOf(first)).toEqual(['done#0', 'partial#0']);
    // The connection breaks and the session expires meanwhile on the server (closed as the TTL would).
    proxy.setDown(true);
    proxy.reset();
    await eventually(() => h.server.sessions.get('s38-lost')?.isAttached === false, 'the session detached on the server', 30_000);
    h.server.sessions.close(h.server.sessions.get('s38-lost')!);
    proxy.setDown(false);
    // A submit after the loss goes to the new session too.
    await within(session.submit(mathTask('after', 1, 400)), 60_000, 'a submit after the loss');
    session.close();
    const rest = await within(reader.rest(), 60_000, 'the end of the session');
    // `fresh` had nothing here: submitted again and delivered, once. `partial` is not (its sample 1 would come from a
    // second run, or its sample 0 twice): lost alone, named, with what had arrived.
    expect(keysOf(rest)).toEqual(['after#0', 'fresh#0']);
    expect(lost.map((e) => [e.name, e.taskId, e.numSamples, e.receivedSampleIndexes])).toEqual([['TaskLostError', 'partial', 2, [0]]]);
    expect(lost[0]!.message).toMatch(/partial lost with its session.*1 of its 2 samples had arrived/);
    expect((lost[0]!.cause as { code?: number }).code).toBe(status.NOT_FOUND);
    expect(session.lostTasks).toEqual(lost);
    expect([session.stats.sessionsLost, session.stats.resubmitted, session.stats.tasksLost]).toEqual([1, 1, 1]);
    // Everything the new session sent was acked: it closed on the server.
    await eventually(() => h.server.sessions.get('s38-lost') === undefined, 'the new session closed on the server', 30_000);
  }, 120_000);

  it('resubmitLostTasks: a server restarted without a journal runs an untouched task again; a partial one is lost alone', async () => {
    const slowSeeds = new Set([0, 1].flatMap((turn) => [segmentSeed(300, 0, turn, 0), segmentSeed(200, 1, turn, 0)]));
    const a = await startServerHarness({ config: { journal: { dir: null } }, engine: { requestLatencyMs: ({ body }) => (slowSeeds.has(body.seed as number) ? 5_000 : 0) } });
    let aClosed = false;
    cleanups.push(() => (aClosed ? undefined : a.close()));
    const proxy = await proxyTo(a.server.address);
    cleanups.push(() => proxy.close());
    const client = new RolloutClient(proxy.address);
    cleanups.push(() => client.close());
    const session = client.openSession({ sessionId: 's38-restart', reconnectForMs: 60_000, resubmitLostTasks: true });
    const reader = new TrajectoryReader(session);
    await session.submit(mathTask('done', 1, 100));
    await session.submit(mathTask('partial', 2, 200));
    await session.submit(mathTask('fresh', 1, 300));
    expect(keysOf(await within(reader.take(2), 60_000, 'the fast samples'))).toEqual(['done#0', 'partial#0']);
    proxy.setDown(true);
    proxy.reset();
    aClosed = true;
    await a.close();
    const b = await startServerHarness({ config: { journal: { dir: null } } });
    cleanups.push(() => b.close());
    proxy.setUpstream(b.server.address);
    proxy.setDown(false);
    session.close();
    const rest = await within(reader.rest(), 60_000, 'the end of the session');
    expect(keysOf(rest)).toEqual(['fresh#0']);
    expect(session.lostTasks.map((e) => [e.taskId, e.receivedSampleIndexes])).toEqual([['partial', [0]]]);
    expect([session.stats.sessionsLost, session.stats.resubmitted, session.stats.tasksLost]).toEqual([1, 1, 1]);
    await eventually(() => b.server.sessions.get('s38-restart') === undefined, 'the new session closed on the restarted server', 30_000);
  }, 120_000);

  it('refuses resubmitLostTasks without reconnectForMs, by name', () => {
    const client = new RolloutClient('127.0.0.1:1');
    cleanups.push(() => client.close());
    expect(() => client.openSession({ resubmitLostTasks: true })).toThrow(/resubmitLostTasks: needs reconnectForMs/);
  });

  it('forgets the cancel of a task once its samples came: a long session does not keep (and re-send) every cancel', async () => {
    const { client } = await setup({ tokenLatencyMs: 50 }); // ~13 s a sample: cancelled while it runs
    const session = client.openSession({ sessionId: 's38-cancels', reconnectForMs: 60_000 });
    const cancels = (): number => (session as unknown as { cancels: RecentKeys }).cancels.size;
    for (let i = 0; i < 3; i++) {
      await session.submit(mathTask(`cancel-${i}`, 1, 10 + i));
      session.cancel(`cancel-${i}`);
    }
    session.close();
    const reader = new TrajectoryReader(session);
    const got = await within(reader.rest(), 60_000, 'the cancelled samples');
    expect(keysOf(got)).toEqual(['cancel-0#0', 'cancel-1#0', 'cancel-2#0']);
    expect(got.map((t) => t.status)).toEqual(Array(3).fill(TrajectoryStatus.TRAJECTORY_STATUS_CANCELLED));
    expect(cancels()).toBe(0);
  }, 120_000);
});

describe('a server that ends the Rollout stream with OK before the client closed the session', () => {
  it('fails iteration with an error saying so, instead of ending it as if every trajectory had come', async () => {
    // TEST DOUBLE of a misbehaving server (or proxy): it opens the session, accepts a task, and ends the call with OK.
    const server = new GrpcServer();
    server.addService(RolloutServiceService, {
      rollout: (call: ServerDuplexStream<RolloutRequest, RolloutResponse>) => {
        call.on('data', (request: RolloutRequest) => {
          const kind = request.kind;
          if (kind?.$case === 'open') call.write({ kind: { $case: 'opened', value: SessionOpened.fromPartial({ sessionId: 'early-end' }) } });
          if (kind?.$case === 'task') {
            call.write({ kind: { $case: 'accepted', value: { taskId: kind.value.taskId, numSamples: 2, duplicate: false, alreadyOwed: false, resentSampleIndexes: [] } } });
            call.end();
          }
        });
        call.on('error', () => undefined);
      },
    } as never);
    const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
    cleanups.push(() => void server.forceShutdown());
    const client = new RolloutClient(`127.0.0.1:${port}`);
    cleanups.push(() => client.close());
    const session = client.openSession();
    await session.submit(mathTask('owed', 2, 1));
    const iteration = (async () => {
      for await (const t of session.trajectories()) void t;
    })();
    const err = await within(iteration.then(() => undefined, (e: unknown) => e), 30_000, 'the end of iteration');
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toMatch(/rollout stream ended by the server \(status OK\) before this client closed the session/);
    expect((err as { code?: number }).code).toBe(status.INTERNAL);
  }, 60_000);
});
