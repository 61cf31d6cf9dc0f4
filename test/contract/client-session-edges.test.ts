import { connect, createServer, type Socket } from 'node:net';
import { status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { RolloutRequest, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { RolloutClient, TaskRejectedError } from '../../src/client/rollout-client.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import type { Environment } from '../../src/environments/types.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';

// Found by a review of the trainer-facing clients (each reproduced against a real server before its fix).

/** One turn, reward 1: trajectories of a few hundred bytes, finished at once. */
const quick: Environment<{ n: number }> = {
  name: 'quick',
  description: 'one turn',
  instanceSchema: { type: 'object' },
  validate: (x) => ({ n: Number((x as { n?: number }).n ?? 0) }),
  init: async () => ({ messages: [{ role: 'user', content: 'Say done.' }] }),
  tools: () => [],
  evaluate: async ({ instance }) => ({ reward: 1, details: { correct: 1 }, report: { n: instance.n } }),
};
const task = (taskId: string, numSamples = 1): { taskId: string; environment: string; numSamples: number; instance: Record<string, unknown> } => ({ taskId, environment: 'quick', numSamples, instance: { n: 1 } });
const key = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex}`;
const quickServer = (config: Parameters<typeof startServerHarness>[0] = {}): Promise<ServerHarness> =>
  startServerHarness({ engine: { policy: () => 'done' }, sandboxes: new NullSandboxDriver(), registry: defaultRegistry().register(quick), ...config });

describe('sessions whose delivery is paused (one unacked trajectory at a time)', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    // 1 byte: one unacked trajectory at a time (one alone always fits), the rest are held until acked.
    h = await quickServer({ config: { sessions: { maxUnackedBytes: 1 } } });
  });
  afterAll(async () => h?.close());

  it('a session resumed while trajectories are held gets every one of them once, and its stream ends', async () => {
    const s1 = h.client.openSession({ sessionId: 'held-resume', autoAck: false });
    const c1 = (async () => {
      for await (const _ of s1.trajectories()) void _;
    })().catch(() => undefined);
    await s1.submit(task('hr', 4));
    await eventually(() => h.server.sessions.get('held-resume')?.heldCount === 3, '3 held trajectories', 20_000);
    s1.abort(); // the trainer's connection breaks while delivery is paused
    await c1;
    await eventually(() => h.server.sessions.get('held-resume')?.isAttached === false, 'detach');

    const s2 = h.client.openSession({ sessionId: 'held-resume', resume: true });
    const opened = await s2.opened;
    // Each of the four is owed once, as sent before (redelivered) or not (pending, held ones among them). Which one
    // depends on the wire: Node's HTTP/2 client ends its side before it resets the stream, and the server sends what a
    // half-closed client holds back (it can ack no more), so the held ones may have gone into the dying stream.
    expect(opened.redelivered + opened.pending).toBe(4);
    expect(opened.redelivered).toBeGreaterThanOrEqual(1);
    s2.close();
    const got: string[] = [];
    await within(
      (async () => {
        for await (const t of s2.trajectories()) got.push(key(t));
      })(),
      15_000,
      'the resumed stream to end',
    );
    expect(new Set(got)).toEqual(new Set(['hr#0', 'hr#1', 'hr#2', 'hr#3']));
    await eventually(() => h.server.sessions.get('held-resume') === undefined, 'the session closed, everything acked');
  }, 60_000);

  it('a spec re-sent for a task the session accepted is answered accepted (already owed) while delivery is paused; a new task is refused as temporary', async () => {
    const s = h.client.openSession({ sessionId: 'resend-paused', autoAck: false, retryRejectedForMs: 0 });
    void (async () => {
      for await (const _ of s.trajectories()) void _;
    })().catch(() => undefined);
    await s.submit(task('rp', 3));
    await eventually(() => h.server.sessions.get('resend-paused')?.deliveryPaused === true, 'delivery paused', 20_000);
    const again = await s.submit(task('rp', 3));
    expect(again.alreadyOwed).toBe(true);
    const fresh = await s.submit(task('rp-new', 1)).catch((e: unknown) => e);
    expect(fresh).toBeInstanceOf(TaskRejectedError);
    expect((fresh as TaskRejectedError).code).toBe(status.RESOURCE_EXHAUSTED);
    expect((fresh as TaskRejectedError).retryable).toBe(true);
    s.abort();
  }, 60_000);
});

describe('the TypeScript session on streams that end, specs that cannot be sent, and acks after the loop', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await quickServer();
  });
  afterAll(async () => h?.close());

  it('submit() after the stream failed, or after close(), rejects at once', async () => {
    const s = h.client.openSession({ sessionId: 'dead-stream' });
    await s.opened;
    s.abort();
    // The stream has failed once its loop has (the call's error event came).
    await (async () => {
      for await (const _ of s.trajectories()) void _;
    })().catch(() => undefined);
    await expect(within(s.submit(task('after-dead')), 5_000, 'submit on a failed stream')).rejects.toThrow(/^rollout stream ended/);
    const t = h.client.openSession({ sessionId: 'closed-stream' });
    await t.opened;
    t.close();
    await expect(within(t.submit(task('after-close')), 5_000, 'submit after close')).rejects.toThrow(/session closed/);
  }, 30_000);

  it('a spec that cannot be encoded (a bigint in instance) is refused alone, naming instance; the stream and its other tasks go on', async () => {
    const s = h.client.openSession({ sessionId: 'bad-instance' });
    await s.opened;
    const ok = s.submit(task('good-1', 2));
    const bad = await s.submit({ taskId: 'bad-1', environment: 'quick', numSamples: 1, instance: { n: 5n } }).catch((e: unknown) => e);
    expect(bad).toBeInstanceOf(TaskRejectedError);
    expect(bad).toMatchObject({ field: 'instance', code: status.INVALID_ARGUMENT, retryable: false });
    await ok;
    s.close();
    const got: string[] = [];
    for await (const t of s.trajectories()) got.push(key(t));
    expect(got.sort()).toEqual(['good-1#0', 'good-1#1']);
  }, 60_000);

  it('a task id that UTF-8 cannot carry (a lone surrogate) is refused at submit, naming task_id, instead of waiting for ever', async () => {
    // protobufjs writes a lone surrogate as bytes that are not UTF-8; the server refuses such a spec by field, but it
    // cannot name a task id it could not decode (taskId ''), so the submit's answer never found its caller.
    const s = h.client.openSession({ sessionId: 'lone-surrogate-id' });
    await s.opened;
    const bad = await within(s.submit({ taskId: 'bad-\uD800', environment: 'quick', numSamples: 1, instance: { n: 1 } }).catch((e: unknown) => e), 5_000, 'the refusal');
    expect(bad).toBeInstanceOf(TaskRejectedError);
    expect(bad).toMatchObject({ field: 'task_id', code: status.INVALID_ARGUMENT, retryable: false });
    await s.submit(task('after-bad-id', 1));
    s.close();
    const got: string[] = [];
    for await (const t of s.trajectories()) got.push(key(t));
    expect(got).toEqual(['after-bad-id#0']);
  }, 30_000);

  it('a task is encoded once (submit encodes it to refuse an unencodable one; the stream sends those bytes)', async () => {
    const s = h.client.openSession({ sessionId: 'encode-once' });
    await s.opened;
    const encode = vi.spyOn(RolloutRequest, 'encode');
    try {
      await s.submit(task('once', 2));
      expect(encode.mock.calls.filter(([r]) => r.kind?.$case === 'task')).toHaveLength(1);
    } finally {
      encode.mockRestore();
    }
    s.close();
    const got: Trajectory[] = [];
    for await (const t of s.trajectories()) got.push(t);
    expect(got.map(key).sort()).toEqual(['once#0', 'once#1']);
    expect(got[0]!.environment).toBe('quick');
  }, 60_000);

  it('with autoAck off the loop ends once all is received, and acks sent after it reach the server (the session then closes)', async () => {
    const s = h.client.openSession({ sessionId: 'manual-ack', autoAck: false });
    await s.submit(task('ma', 2));
    s.close();
    const batch: Trajectory[] = [];
    for await (const t of s.trajectories()) batch.push(t); // one training step's batch
    expect(h.server.sessions.get('manual-ack')?.unackedCount).toBe(2);
    s.ack(batch.map((t) => ({ taskId: t.taskId, sampleIndex: t.sampleIndex }))); // after the step
    await eventually(() => h.server.sessions.get('manual-ack') === undefined, 'the session closed with everything acked');
  }, 60_000);
});

describe('the TypeScript client on a server whose host vanished (no FIN, no RST)', () => {
  it('fails the session\u2019s stream within its keepalive instead of waiting forever', async () => {
    const h = await quickServer({ engine: { policy: () => 'done', tokenLatencyMs: 5000 } });
    const [host, port] = h.server.address.split(':') as [string, string];
    let dead = false;
    const sockets = new Set<Socket>();
    // A TCP relay that, once `dead`, forwards nothing and closes nothing: a black hole, as a powered-off host is.
    const relay = createServer((down) => {
      const up = connect(Number(port), host);
      sockets.add(down).add(up);
      down.on('data', (d) => void (dead || up.write(d)));
      up.on('data', (d) => void (dead || down.write(d)));
      down.on('close', () => dead || up.destroy());
      up.on('close', () => dead || down.destroy());
      down.on('error', () => undefined);
      up.on('error', () => undefined);
    });
    await new Promise<void>((r) => relay.listen(0, '127.0.0.1', r));
    const client = new RolloutClient(`127.0.0.1:${(relay.address() as { port: number }).port}`, { keepalive: { timeMs: 500, timeoutMs: 1000 } });
    try {
      const session = client.openSession({ sessionId: 'dead-host' });
      await session.submit(task('dh'));
      session.close();
      dead = true;
      const loop = (async () => {
        for await (const _ of session.trajectories()) void _;
      })();
      await expect(within(loop, 15_000, 'the stream to fail')).rejects.toMatchObject({ code: status.UNAVAILABLE });
    } finally {
      client.close();
      for (const s of sockets) s.destroy();
      relay.close();
      await h.close();
    }
  }, 60_000);
});
