import { afterEach, describe, expect, it } from 'vitest';
import { Server as GrpcServer, ServerCredentials, status, type ServerDuplexStream } from '@grpc/grpc-js';
import { RolloutClient, TaskRejectedError } from '../../src/client/rollout-client.js';
import { RolloutServiceService, SessionOpened, Trajectory, type RolloutRequest, type RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { mathTask } from '../support/harness.js';
import { startServerHarness, TrajectoryReader, type ServerHarness } from '../support/server-harness.js';
import { proxyTo } from '../support/tcp-proxy.js';
import { eventually, within } from '../support/wait.js';

// Review s42 of the TypeScript client (helper-104), against a real server on 127.0.0.1:0.

const harnesses: ServerHarness[] = [];
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  await Promise.all(harnesses.splice(0).map((h) => h.close()));
});

type Call = ServerDuplexStream<RolloutRequest, RolloutResponse>;

/** A TEST DOUBLE of a Rollout server (grpc-js on 127.0.0.1:0, the real protocol) whose `onStream` handles each stream. */
async function double(onStream: (call: Call) => void): Promise<RolloutClient> {
  const server = new GrpcServer();
  server.addService(RolloutServiceService, {
    rollout: (call: Call) => {
      call.on('error', () => undefined);
      onStream(call);
    },
  } as never);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  cleanups.push(() => void server.forceShutdown());
  const client = new RolloutClient(`127.0.0.1:${port}`);
  cleanups.push(() => client.close());
  return client;
}

describe('RolloutClient.watch, review s42', () => {
  it('leaving the loop (break) cancels the call: its watch.maxOpen slot is free for the next watch', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null }, watch: { maxOpen: 1 } } });
    harnesses.push(h);
    const subscribers = (): number => h.server.runtime.pipeline.events$.observers.length;
    const before = subscribers();
    for (let i = 0; i < 3; i++) {
      const watch = h.client.watch({ statsIntervalMs: 100 });
      let first: string | undefined;
      // The documented way to stop: leave the loop, no cancel() called.
      const served = (async () => {
        for await (const m of watch) {
          first = m.kind?.$case;
          break;
        }
      })().then(
        () => 'served',
        (e: { code?: number }) => `failed with code ${e.code}`,
      );
      expect(await within(served, 30_000, `watch ${i}`)).toBe('served');
      expect(first).toBe('stats');
      // The cancel reaches the server a moment later (RST_STREAM): then its subscription and slot are gone. Without the
      // cancel the call went on reading (the queue dropping what came), so the server never saw it stalled either.
      await eventually(() => subscribers() === before, `watch ${i}'s subscription to end on the server`, 15_000);
    }
  }, 120_000);
});

describe('RolloutSession against a server accepting a task with another num_samples than its spec (a TEST DOUBLE), review s42', () => {
  it.each([
    ['more', 3],
    ['fewer', 1],
  ])('%s samples: the submit rejects naming num_samples, the task is cancelled there, and the session ends (no hang, no partial group)', async (_, claimed) => {
    const cancels: string[] = [];
    const client = await double((call) => {
      call.on('end', () => call.end());
      call.on('data', (request: RolloutRequest) => {
        const kind = request.kind;
        if (kind?.$case === 'open') call.write({ kind: { $case: 'opened', value: SessionOpened.fromPartial({ sessionId: 's42-group' }) } });
        if (kind?.$case === 'cancel') cancels.push(kind.value.taskId);
        if (kind?.$case === 'task') {
          call.write({ kind: { $case: 'accepted', value: { taskId: kind.value.taskId, numSamples: claimed, duplicate: false, alreadyOwed: false, resentSampleIndexes: [] } } });
          // What it then sends of that group: one sample only (a larger group never comes whole).
          call.write({ kind: { $case: 'trajectory', value: Trajectory.fromPartial({ taskId: kind.value.taskId, sampleIndex: 0 }) } });
        }
      });
    });
    const session = client.openSession({ sessionId: 's42-group' });
    const err = await within(
      session.submit(mathTask('two', 2, 1)).then(
        () => undefined,
        (e: unknown) => e,
      ),
      30_000,
      'the answer to the submit',
    );
    expect(err).toBeInstanceOf(TaskRejectedError);
    expect(err).toMatchObject({ taskId: 'two', field: 'num_samples', code: status.FAILED_PRECONDITION, retryable: false });
    expect((err as Error).message).toMatch(new RegExp(`accepted it with num_samples ${claimed}, not the 2 of its spec`));
    await eventually(() => cancels.includes('two'), 'the task cancelled on the server', 30_000);
    session.close();
    expect(await within(new TrajectoryReader(session).rest(), 30_000, 'the end of the session')).toEqual([]);
    expect(session.stats.protocolViolations).toBeGreaterThanOrEqual(1);
  }, 60_000);
});

describe('RolloutSession reconnect while the consumer is slow, review s42', () => {
  it('a stream re-opened while highWater trajectories wait unread reads its SessionOpened: a consumer busy past openTimeoutMs and reconnectForMs does not fail the session', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null } } });
    harnesses.push(h);
    const proxy = await proxyTo(h.server.address);
    cleanups.push(() => proxy.close());
    const client = new RolloutClient(proxy.address);
    cleanups.push(() => client.close());
    const session = client.openSession({ sessionId: 's42-slow', highWater: 2, openTimeoutMs: 500, reconnectForMs: 3_000 });
    for (let i = 0; i < 3; i++) await session.submit(mathTask(`slow-${i}`, 1, i));
    // All three sent; the client read two into its queue (highWater) and paused reading: the trainer is busy.
    await eventually(() => h.server.sessions.get('s42-slow')?.unackedCount === 3, 'three trajectories sent, none read', 60_000);
    proxy.reset();
    // A training step longer than openTimeoutMs and reconnectForMs together: the re-opened stream must be read meanwhile.
    await new Promise((resolve) => setTimeout(resolve, 6_000));
    const reader = new TrajectoryReader(session);
    const got = await within(reader.take(3), 30_000, 'the three trajectories');
    session.close();
    const rest = await within(reader.rest(), 30_000, 'the end of the session');
    expect([...got, ...rest].map((t) => t.taskId).sort()).toEqual(['slow-0', 'slow-1', 'slow-2']);
    expect(session.stats.reconnects).toBe(1);
  }, 120_000);
});

describe('RolloutSession highWater, review s42', () => {
  it('refuses a highWater that would never stop reading (0, negative, a fraction, NaN), by name; Infinity is allowed', () => {
    const client = new RolloutClient('127.0.0.1:1');
    cleanups.push(() => client.close());
    for (const highWater of [0, -1, 1.5, NaN]) {
      expect(() => client.openSession({ highWater })).toThrow(/^highWater: must be a whole number of trajectories of at least 1/);
    }
    client.openSession({ highWater: Infinity, openTimeoutMs: Infinity }).abort();
  });
});

describe('RolloutSession callbacks, review s42', () => {
  it('an async onStage that rejects is reported as a process warning and counted, the session going on (no unhandled rejection)', async () => {
    const h = await startServerHarness({ config: { journal: { dir: null } } });
    harnesses.push(h);
    const warnings: Error[] = [];
    const onWarning = (w: Error): void => void (w.name === 'RolloutCallbackError' && warnings.push(w));
    process.on('warning', onWarning);
    cleanups.push(() => void process.off('warning', onWarning));
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown): void => void unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    cleanups.push(() => void process.off('unhandledRejection', onUnhandled));
    const session = h.client.openSession({ sessionId: 's42-async-callback', stageEvents: true });
    let stages = 0;
    // eslint-disable-next-line @typescript-eslint/no-misused-promises -- on purpose: what a trainer without this lint rule may write
    session.onStage = async () => {
      stages++;
      throw new Error('the dashboard is down');
    };
    await session.submit(mathTask('watched', 2, 1));
    session.close();
    const got = await within(new TrajectoryReader(session).rest(), 60_000, 'the session to end');
    expect(got.map((t) => t.sampleIndex).sort()).toEqual([0, 1]);
    expect(stages).toBeGreaterThan(0);
    await eventually(() => warnings.length === stages, 'a warning per rejected callback', 10_000);
    expect(session.stats.callbackErrors).toBe(stages);
    expect(warnings[0]!.message).toMatch(/^RolloutSession\.onStage threw \(ignored, the session goes on\): the dashboard is down/);
    expect(unhandled).toEqual([]);
  }, 120_000);
});

describe('RolloutSession against a server sending a message over maxReceiveMessageBytes (a TEST DOUBLE), review s42', () => {
  it('fails the session (not re-opened) with RESOURCE_EXHAUSTED naming the option to raise', async () => {
    let streams = 0;
    const server = new GrpcServer();
    server.addService(RolloutServiceService, {
      rollout: (call: Call) => {
        streams++;
        call.on('error', () => undefined);
        call.on('data', (request: RolloutRequest) => {
          if (request.kind?.$case !== 'open') return;
          call.write({ kind: { $case: 'opened', value: SessionOpened.fromPartial({ sessionId: 's42-big', pending: 1 }) } });
          // About 4 KB: over the client's 1000 bytes.
          call.write({ kind: { $case: 'trajectory', value: Trajectory.fromPartial({ taskId: 'big', sampleIndex: 0, responseTokenIds: Array.from({ length: 2000 }, (_, i) => i) }) } });
        });
      },
    } as never);
    const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
    cleanups.push(() => void server.forceShutdown());
    const client = new RolloutClient(`127.0.0.1:${port}`, { maxReceiveMessageBytes: 1000 });
    cleanups.push(() => client.close());
    const session = client.openSession({ sessionId: 's42-big', resume: true, reconnectForMs: 30_000 });
    const err = await within(
      new TrajectoryReader(session).rest().then(
        () => undefined,
        (e: unknown) => e,
      ),
      30_000,
      'the session to fail',
    );
    expect(err).toMatchObject({ code: status.RESOURCE_EXHAUSTED });
    expect((err as Error).message).toMatch(/sent a message over this client's maxReceiveMessageBytes \(Received message larger than max \(\d+ vs 1000\)\): raise that RolloutClient option/);
    expect(session.stats.reconnects).toBe(0);
    expect(streams).toBe(1);
  }, 60_000);
});

describe('RolloutSession against a server that floods trajectories without opening the session (a TEST DOUBLE), review s42', () => {
  it('stops reading at its bound (reading before SessionOpened is not unbounded) and fails with OpenTimeoutError', async () => {
    const client = await double((call) => {
      // Never a SessionOpened: trajectories only, as fast as the transport takes them.
      for (let i = 0; i < 5_000; i++) call.write({ kind: { $case: 'trajectory', value: Trajectory.fromPartial({ taskId: 'flood', sampleIndex: i }) } });
    });
    const session = client.openSession({ sessionId: 's42-flood', highWater: 4, openTimeoutMs: 1_500 });
    // The consumer is busy until the session has failed: what it then gets is what the session buffered.
    await within(session.opened.then(() => undefined, () => undefined), 30_000, 'the open to time out');
    const got: number[] = [];
    const err = await within(
      (async () => {
        for await (const t of session.trajectories()) got.push(t.sampleIndex);
      })().then(
        () => undefined,
        (e: unknown) => e,
      ),
      30_000,
      'the session to fail',
    );
    expect(err).toMatchObject({ name: 'OpenTimeoutError', code: status.DEADLINE_EXCEEDED });
    expect(got.length).toBeLessThanOrEqual(8);
  }, 60_000);
});
