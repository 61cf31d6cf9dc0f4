import { spawn } from 'node:child_process';
import { createServer, connect, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { status, type ServiceError } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutClient, type RolloutSession } from '../../src/client/rollout-client.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import { calcPolicy, CALC_ENVIRONMENT, createCalcEnvironment } from '../../src/testing/calc-environment.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';

// A trainer that vanishes mid-stream — its process killed -9, or its TCP connection cut — and comes back with
// `resume`: it gets exactly the trajectories it had not acked (those finished while it was away, and those still
// running), each once, and none it had acked; the tasks ran on meanwhile. Real server on 127.0.0.1:0, the fake vLLM
// (test double) at 20 ms a token so tasks are still running when the trainer goes, in-process calc tools.
//
// Bound: a resumed session gets everything within the tasks' own run time (~1–3 s here) plus slack for a busy box;
// 60 s is asserted only to turn a hang into a failure.

const BOUND_MS = 60_000;
const OK = new Set([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED]);
const key = (t: { taskId: string; sampleIndex: number }): string => `${t.taskId}#${t.sampleIndex}`;
const trainerScript = fileURLToPath(new URL('./trainer-process.ts', import.meta.url));

let h: ServerHarness;
beforeAll(async () => {
  h = await startServerHarness({
    sandboxes: new NullSandboxDriver(),
    registry: defaultRegistry().register(createCalcEnvironment()),
    engine: { policy: calcPolicy, tokenLatencyMs: 20 },
  });
});
afterAll(async () => h?.close());

/**
 * Resumes `sessionId` once the server has seen the old stream go. Until then a resume is refused with
 * FAILED_PRECONDITION ("attached to another stream") and has no effect, so the test waits for that refusal to stop;
 * taking a session over from a stream the server still believes alive is helper-sessions' resume takeover.
 */
async function resume(client: RolloutClient, sessionId: string): Promise<{ session: RolloutSession; attempts: number }> {
  let attempts = 0;
  let session: RolloutSession | undefined;
  await eventually(async () => {
    attempts++;
    const s = client.openSession({ sessionId, resume: true });
    try {
      await s.opened;
      session = s;
      return true;
    } catch (err) {
      if ((err as ServiceError).code !== status.FAILED_PRECONDITION) throw err;
      return false;
    }
  }, `session ${sessionId} to be resumable`);
  return { session: session!, attempts };
}

/** Everything the session owes after a resume: exactly the samples not acked, each once, all well-formed. */
async function expectExactlyTheUnacked(session: RolloutSession, all: string[], acked: string[]): Promise<Trajectory[]> {
  const opened = await session.opened;
  session.close();
  const got = await within(collect(session.trajectories()), BOUND_MS, 'the resumed session');
  const keys = got.map(key);
  expect(new Set(keys).size, 'each once').toBe(keys.length);
  expect(keys.filter((k) => acked.includes(k)), 'nothing acked comes again').toEqual([]);
  expect(new Set([...keys, ...acked])).toEqual(new Set(all));
  expect(opened.redelivered + opened.pending).toBe(all.length - acked.length);
  console.log(`resumed: ${opened.redelivered} re-sent, ${opened.pending} still running, ${acked.length} acked before`);
  for (const t of got) {
    expect(OK.has(t.status), `${key(t)} ${TrajectoryStatus[t.status]} ${t.error}`).toBe(true);
    expect(invariantViolations(t)).toEqual([]);
  }
  return got;
}

const samplesOf = (sessionId: string, tasks: number): string[] => [
  ...Array.from({ length: tasks }, (_, i) => [`${sessionId}-t${i}#0`, `${sessionId}-t${i}#1`]).flat(),
  `${sessionId}-marker#0`,
  `${sessionId}-marker#1`,
];

describe('a trainer that vanishes mid-stream and comes back', () => {
  it('its process killed -9: the resumed session gets exactly what it had not acked, once', async () => {
    const sessionId = 'vanished-process';
    const child = spawn(process.execPath, ['--import', 'tsx', trainerScript, h.server.address, sessionId, '6', '3'], { stdio: ['ignore', 'pipe', 'inherit'] });
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    const line = await within(new Promise<string>((resolve) => createInterface({ input: child.stdout }).once('line', resolve)), BOUND_MS, 'the trainer process');
    const { acked } = JSON.parse(line) as { acked: string[] };
    expect(acked).toHaveLength(3);
    child.kill('SIGKILL');
    await exited;

    const client = new RolloutClient(h.server.address);
    try {
      const { session, attempts } = await resume(client, sessionId);
      console.log(`trainer killed -9: resumed after ${attempts} attempt(s)`);
      await expectExactlyTheUnacked(session, samplesOf(sessionId, 6), acked);
    } finally {
      client.close();
    }
  });

  it('its TCP connection destroyed: the same, and the tasks ran on while it was away', async () => {
    const sessionId = 'vanished-connection';
    const proxy = await tcpProxy(h.server.port);
    const cut = new RolloutClient(proxy.address);
    const session = cut.openSession({ sessionId, autoAck: false });
    const tasks = 5;
    for (let i = 0; i < tasks; i++) await session.submit(mathTask(`${sessionId}-t${i}`, 2, 8100 + i, { environment: CALC_ENVIRONMENT }));
    const iterator = session.trajectories()[Symbol.asyncIterator]();
    const first = [(await iterator.next()).value as Trajectory, (await iterator.next()).value as Trajectory];
    session.ack(first.map((t) => ({ taskId: t.taskId, sampleIndex: t.sampleIndex })));
    // Handled in order: once the marker is accepted, the server has applied the acks before it.
    await session.submit(mathTask(`${sessionId}-marker`, 2, 8199, { environment: CALC_ENVIRONMENT }));
    proxy.cut();
    // What the client had buffered before the cut still comes out (unacked: the server owes it again); then the error.
    const ending = (async () => {
      for (;;) {
        const next = await iterator.next().catch((err: unknown) => err);
        if (next instanceof Error) return next;
        if ((next as IteratorResult<Trajectory>).done) return undefined;
      }
    })();
    expect(await within(ending, BOUND_MS, 'the cut stream to fail')).toBeInstanceOf(Error);
    cut.close();

    const client = new RolloutClient(h.server.address);
    try {
      const { session: resumed, attempts } = await resume(client, sessionId);
      console.log(`connection cut: resumed after ${attempts} attempt(s)`);
      await expectExactlyTheUnacked(resumed, samplesOf(sessionId, tasks), first.map(key));
    } finally {
      client.close();
      await proxy.close();
    }
  });
});

/** A TCP proxy to 127.0.0.1:`port` whose connections a test can destroy at once (the network going away). */
async function tcpProxy(port: number): Promise<{ address: string; cut(): void; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  const track = (s: Socket): Socket => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => undefined);
    return s;
  };
  const server = createServer((client) => {
    const upstream = track(connect(port, '127.0.0.1'));
    track(client);
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port: local } = server.address() as { port: number };
  return {
    address: `127.0.0.1:${local}`,
    cut: () => {
      for (const s of sockets) s.destroy();
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
