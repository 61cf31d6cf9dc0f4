import { afterEach, describe, expect, it } from 'vitest';
import { Server as GrpcServer, ServerCredentials, status, type ServerDuplexStream } from '@grpc/grpc-js';
import { OpenTimeoutError, RolloutClient, RolloutSession } from '../../src/client/rollout-client.js';
import { RolloutServiceService, SessionOpened, Trajectory, type RolloutRequest, type RolloutResponse } from '../../gen/ts/rollout/v1/rollout.js';
import { BackendServiceService } from '../../gen/ts/rollout/v1/backend.js';
import { mathTask } from '../support/harness.js';
import { TrajectoryReader } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';

// Review s40 of the TypeScript client. Each test runs the real client against a TEST DOUBLE of a Rollout (or Backend)
// server: grpc-js on 127.0.0.1:0 speaking the real protocol, misbehaving as a buggy server or a proxy may - it never
// answers the open, answers a spec nobody sent, sends a sample outside its group, a trajectory of a task it was never
// given, a sample twice after the client forgot its key, or never answers an admin call.

type Call = ServerDuplexStream<RolloutRequest, RolloutResponse>;

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A Rollout server double whose `onStream` handles each stream (numbered from 1); its address and a client of it. */
async function double(onStream: (call: Call, n: number) => void): Promise<{ client: RolloutClient; address: string }> {
  const server = new GrpcServer();
  let streams = 0;
  server.addService(RolloutServiceService, {
    rollout: (call: Call) => {
      call.on('error', () => undefined);
      onStream(call, ++streams);
    },
  } as never);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  cleanups.push(() => void server.forceShutdown());
  const address = `127.0.0.1:${port}`;
  const client = new RolloutClient(address);
  cleanups.push(() => client.close());
  return { client, address };
}

function opened(sessionId: string): RolloutResponse {
  return { kind: { $case: 'opened', value: SessionOpened.fromPartial({ sessionId }) } };
}

function accepted(taskId: string, numSamples: number): RolloutResponse {
  return { kind: { $case: 'accepted', value: { taskId, numSamples, duplicate: false, alreadyOwed: false, resentSampleIndexes: [] } } };
}

function trajectory(taskId: string, sampleIndex: number): RolloutResponse {
  return { kind: { $case: 'trajectory', value: Trajectory.fromPartial({ taskId, sampleIndex }) } };
}

function keysOf(ts: Trajectory[]): string[] {
  return ts.map((t) => `${t.taskId}#${t.sampleIndex}`).sort();
}

async function failureOf(p: Promise<unknown>, what: string): Promise<Error & { code?: number }> {
  const err = await within(p.then(() => undefined, (e: unknown) => e), 30_000, what);
  expect(err).toBeInstanceOf(Error);
  return err as Error & { code?: number };
}

/** Process warnings of `name` from now on. */
function warningsNamed(name: string): Error[] {
  const seen: Error[] = [];
  const onWarning = (w: Error): void => void (w.name === name && seen.push(w));
  process.on('warning', onWarning);
  cleanups.push(() => void process.off('warning', onWarning));
  return seen;
}

describe('RolloutSession against a server that never sends SessionOpened, review s40', () => {
  it('without reconnect: `opened`, a submit and iteration fail with OpenTimeoutError naming the server, and the call is cancelled', async () => {
    let cancelled = false;
    const { client, address } = await double((call) => {
      call.on('cancelled', () => void (cancelled = true));
      // Takes the stream and every request, answers nothing.
    });
    const session = client.openSession({ sessionId: 's40-mute', openTimeoutMs: 300 });
    const submit = session.submit(mathTask('never', 1, 1)).then(() => undefined, (e: unknown) => e);
    const err = await failureOf(session.opened, 'the open nobody answers');
    expect(err).toBeInstanceOf(OpenTimeoutError);
    expect(err.code).toBe(status.DEADLINE_EXCEEDED);
    expect(err.message).toContain(`rollout server ${address}`);
    expect(err.message).toMatch(/session s40-mute but sent no SessionOpened within openTimeoutMs \(300 ms\)/);
    expect(await within(submit, 30_000, 'the submit on it')).toBe(err);
    expect(await failureOf(new TrajectoryReader(session).rest(), 'iteration')).toBe(err);
    await eventually(() => cancelled, 'the double saw the call cancelled', 30_000);
  }, 60_000);

  it('with reconnectForMs: a stream whose open is not answered is re-opened, and the session works on the next one', async () => {
    const { client } = await double((call, n) => {
      call.on('end', () => call.end());
      call.on('data', (request: RolloutRequest) => {
        const kind = request.kind;
        if (kind?.$case === 'open' && n >= 2) call.write(opened('s40-second'));
        if (kind?.$case === 'task' && n >= 2) {
          call.write(accepted(kind.value.taskId, 1));
          call.write(trajectory(kind.value.taskId, 0));
        }
      });
    });
    const session = client.openSession({ sessionId: 's40-second', openTimeoutMs: 300, reconnectForMs: 30_000 });
    await within(session.opened, 30_000, 'the open answered on the second stream');
    expect(session.stats.reconnects).toBe(1);
    await within(session.submit(mathTask('later', 1, 1)), 30_000, 'the submit');
    session.close();
    expect(keysOf(await within(new TrajectoryReader(session).rest(), 30_000, 'the end of the session'))).toEqual(['later#0']);
  }, 60_000);

  it('refuses an openTimeoutMs that is not a number of milliseconds above 0, by name', () => {
    const client = new RolloutClient('127.0.0.1:1');
    cleanups.push(() => client.close());
    expect(() => client.openSession({ openTimeoutMs: -1 })).toThrow(/openTimeoutMs: must be a non-negative number of milliseconds/);
    expect(() => client.openSession({ openTimeoutMs: 0 })).toThrow(/openTimeoutMs: must be more than 0 milliseconds/);
  });
});

describe('RolloutSession against a server breaking the protocol, review s40', () => {
  /** A double answering each task `real` as a group of 2, with `extra` (what the faulty server adds) between its two samples. */
  async function faulty(extra: (call: Call) => void): Promise<RolloutClient> {
    const { client } = await double((call) => {
      call.on('end', () => call.end());
      call.on('data', (request: RolloutRequest) => {
        const kind = request.kind;
        if (kind?.$case === 'open') call.write(opened('s40-faulty'));
        if (kind?.$case === 'task') {
          call.write(accepted(kind.value.taskId, 2));
          call.write(trajectory(kind.value.taskId, 0));
          extra(call);
          // The real second sample comes a while later: a session misled into thinking it had everything ends first.
          setTimeout(() => call.write(trajectory(kind.value.taskId, 1)), 300);
        }
      });
    });
    return client;
  }

  it.each([
    ['an accepted for a task never submitted', (call: Call) => call.write(accepted('ghost', 3)), /TaskAccepted for task ghost, which has no spec waiting/],
    ['a sample index past the group', (call: Call) => call.write(trajectory('real', 7)), /trajectory of task real with sample_index 7, outside its 2 samples/],
    ['a trajectory of a task neither accepted nor owed', (call: Call) => call.write(trajectory('stranger', 0)), /trajectory of task stranger \(sample 0\), a task this stream was neither accepted nor owed/],
  ])('%s is ignored (counted, warned), and the session ends once the real group came', async (_what, extra, warned) => {
    const warnings = warningsNamed('RolloutProtocolWarning');
    const client = await faulty(extra);
    const session = client.openSession();
    await session.submit(mathTask('real', 2, 1));
    session.close();
    expect(keysOf(await within(new TrajectoryReader(session).rest(), 30_000, 'the end of the session'))).toEqual(['real#0', 'real#1']);
    expect(session.stats.protocolViolations).toBe(1);
    await eventually(() => warnings.length === 1, 'the warning', 30_000);
    expect(warnings[0]!.message).toMatch(warned);
    expect(warnings[0]!.message).toMatch(/^rollout server 127\.0\.0\.1:\d+ sent .*: ignored, a faulty server$/);
  }, 60_000);

  it('a flood of violations is counted in full and warned of 10 times', async () => {
    const warnings = warningsNamed('RolloutProtocolWarning');
    const client = await faulty((call) => {
      for (let i = 0; i < 50; i++) call.write(trajectory('real', 100 + i));
    });
    const session = client.openSession();
    await session.submit(mathTask('real', 2, 1));
    session.close();
    expect(keysOf(await within(new TrajectoryReader(session).rest(), 30_000, 'the end of the session'))).toEqual(['real#0', 'real#1']);
    expect(session.stats.protocolViolations).toBe(50);
    await eventually(() => warnings.length === 10, 'the warnings', 30_000);
    expect(warnings[9]!.message).toMatch(/the last warned of; stats\.protocolViolations counts the others/);
  }, 60_000);

  it('a sample of an open group sent again after the session forgot its key is dropped, not delivered twice', async () => {
    const acked = new Set<string>();
    let again: (() => void) | undefined;
    const { client } = await double((call) => {
      call.on('end', () => call.end());
      call.on('data', (request: RolloutRequest) => {
        const kind = request.kind;
        if (kind?.$case === 'open') call.write(opened('s40-forgot'));
        if (kind?.$case === 'task') {
          call.write(accepted(kind.value.taskId, 3));
          call.write(trajectory(kind.value.taskId, 0));
          call.write(trajectory(kind.value.taskId, 1));
          again = () => {
            call.write(trajectory(kind.value.taskId, 0));
            call.write(trajectory(kind.value.taskId, 2));
          };
        }
        if (kind?.$case === 'ack') for (const r of kind.value.trajectories) acked.add(`${r.taskId}#${r.sampleIndex}`);
      });
    });
    // Remembers one key per stream: sample 0's is forgotten once sample 1 came (a week-long stream past 65,536 keys).
    const session = new RolloutSession(client.rollout, {}, undefined, { maxRememberedKeys: 1 });
    const reader = new TrajectoryReader(session);
    await session.submit(mathTask('forgot', 3, 1));
    expect(keysOf(await within(reader.take(2), 30_000, 'the first two samples'))).toEqual(['forgot#0', 'forgot#1']);
    const rest = reader.rest();
    // Consumed and acked: held nowhere here any more, only the group's count knows sample 0 came.
    await eventually(() => acked.has('forgot#0') && acked.has('forgot#1'), 'both acked at the double', 30_000);
    again!();
    session.close();
    expect(keysOf(await within(rest, 30_000, 'the end of the session'))).toEqual(['forgot#2']);
    expect(session.stats.duplicatesDropped).toBe(1);
  }, 60_000);
});

describe('RolloutClient admin calls against a server that never answers, review s40', () => {
  it('addBackend and removeBackend fail with DEADLINE_EXCEEDED after their deadlineMs instead of waiting for ever', async () => {
    // TEST DOUBLE: a BackendService that takes every call and never answers it.
    const server = new GrpcServer();
    const never = (): void => undefined;
    server.addService(BackendServiceService, { addBackend: never, removeBackend: never, listBackends: never, pauseGeneration: never, resumeGeneration: never } as never);
    const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
    cleanups.push(() => void server.forceShutdown());
    const client = new RolloutClient(`127.0.0.1:${port}`);
    cleanups.push(() => client.close());
    const calls = [client.addBackend({ url: 'http://127.0.0.1:9/' }, { deadlineMs: 200 }), client.removeBackend('b', false, { deadlineMs: 200 }), client.removeBackend('b', true, { deadlineMs: 200 })];
    // Each call's failure is taken at once: awaited one after another, the second and third could reject before the
    // loop reached them (an unhandled rejection; CI run 12 on a loaded box).
    const failures = await Promise.all(calls.map((call) => failureOf(call, 'an admin call nobody answers')));
    for (const failure of failures) expect(failure.code).toBe(status.DEADLINE_EXCEEDED);
  }, 60_000);
});

describe('RolloutSession against a server sending bytes the client cannot parse, review s40', () => {
  /** A double whose responses may be raw bytes (what a faulty server's encoder can put on the wire). */
  async function rawDouble(onStream: (call: ServerDuplexStream<RolloutRequest, RolloutResponse | Buffer>, n: number) => void): Promise<RolloutClient> {
    const server = new GrpcServer();
    let streams = 0;
    const method = RolloutServiceService.rollout;
    const service = {
      rollout: { ...method, responseSerialize: (m: RolloutResponse | Buffer) => (Buffer.isBuffer(m) ? m : method.responseSerialize(m)) },
    };
    server.addService(service as never, {
      rollout: (call: ServerDuplexStream<RolloutRequest, RolloutResponse | Buffer>) => {
        call.on('error', () => undefined);
        onStream(call, ++streams);
      },
    } as never);
    const port = await new Promise<number>((resolve, reject) => server.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
    cleanups.push(() => void server.forceShutdown());
    const client = new RolloutClient(`127.0.0.1:${port}`);
    cleanups.push(() => client.close());
    return client;
  }

  /** A length-delimited field 1 announcing 5 bytes and carrying 1: no protobuf decoder parses it. */
  const garbage = Buffer.from([0x0a, 0x05, 0x01]);

  it('garbled once: the stream is re-opened with resume and the group completes', async () => {
    const client = await rawDouble((call, n) => {
      call.on('end', () => call.end());
      call.on('data', (request: RolloutRequest) => {
        const kind = request.kind;
        if (kind?.$case === 'open' && n === 1) call.write(opened('s40-garbled-once'));
        if (kind?.$case === 'open' && n === 2) {
          // The resume: the unacked sample re-sent, as it should have been the first time.
          call.write({ kind: { $case: 'opened', value: SessionOpened.fromPartial({ sessionId: 's40-garbled-once', redelivered: 1 }) } });
          call.write(trajectory('g', 1));
        }
        if (kind?.$case === 'task' && n === 1) {
          call.write(accepted(kind.value.taskId, 2));
          call.write(trajectory(kind.value.taskId, 0));
          call.write(garbage);
        }
      });
    });
    const session = client.openSession({ sessionId: 's40-garbled-once', reconnectForMs: 30_000 });
    const reader = new TrajectoryReader(session);
    await session.submit(mathTask('g', 2, 1));
    expect(keysOf(await within(reader.take(2), 30_000, 'both samples'))).toEqual(['g#0', 'g#1']);
    expect(session.stats.reconnects).toBe(1);
    session.close();
    expect(await within(reader.rest(), 30_000, 'the end of the session')).toEqual([]);
  }, 60_000);

  it('the same garbage on every resume ends the session after 3 streams, even with reconnectForMs: Infinity', async () => {
    let streams = 0;
    const client = await rawDouble((call) => {
      streams++;
      call.on('data', (request: RolloutRequest) => {
        if (request.kind?.$case !== 'open') return;
        call.write(opened('s40-garbled'));
        call.write(garbage); // an unacked trajectory re-sent on every resume, as garbled as the first time
      });
    });
    const session = client.openSession({ sessionId: 's40-garbled', reconnectForMs: Infinity });
    const err = await failureOf(new TrajectoryReader(session).rest(), 'the end of the session');
    expect(err.code).toBe(status.INTERNAL);
    expect(err.message).toMatch(/^rollout stream failed: Response message parsing error.*: on 3 streams in a row \(each re-opened with resume\)/);
    expect(streams).toBe(3);
    expect(session.stats.reconnects).toBe(2);
  }, 60_000);
});
