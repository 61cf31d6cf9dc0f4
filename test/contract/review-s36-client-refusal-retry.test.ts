import { status } from '@grpc/grpc-js';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { RolloutRequest } from '../../gen/ts/rollout/v1/rollout.js';
import { RolloutClient, TaskRejectedError, type RolloutSession } from '../../src/client/rollout-client.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import type { Environment } from '../../src/environments/types.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { collect } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually, gate, within } from '../support/wait.js';

// Parity of the TypeScript session with the Python client on temporary refusals (review s36): a task the server
// refuses for now (TaskRejected.code RESOURCE_EXHAUSTED / UNAVAILABLE) is submitted again with backoff for up to
// retryRejectedForMs; a permanent refusal fails at once. Each test failed on the client before (the submit rejected at
// the first refusal).

/** Samples started per task id (the environment's init runs once per sample run): a task run twice shows here. */
const runs = new Map<string, number>();
const counted: Environment<{ id: string }> = {
  name: 'counted',
  description: 'one turn; counts its runs',
  instanceSchema: { type: 'object' },
  validate: (x) => ({ id: String((x as { id?: unknown }).id ?? '') }),
  init: async ({ instance }) => {
    runs.set(instance.id, (runs.get(instance.id) ?? 0) + 1);
    return { messages: [{ role: 'user', content: 'Say done.' }] };
  },
  tools: () => [],
  evaluate: async () => ({ reward: 1, details: {}, report: {} }),
};
const task = (taskId: string, numSamples = 1): { taskId: string; environment: string; numSamples: number; instance: Record<string, unknown> } => ({
  taskId,
  environment: 'counted',
  numSamples,
  instance: { id: taskId },
});
const key = (t: { taskId: string; sampleIndex: number }): string => `${t.taskId}#${t.sampleIndex}`;

/**
 * A client whose Rollout streams count, per task id, the task requests that went to the transport (each serialized
 * request is one message on the wire): what the server saw, whatever the session believes it did.
 */
function countingClient(address: string): { client: RolloutClient; sends: Map<string, number> } {
  const client = new RolloutClient(address);
  const sends = new Map<string, number>();
  const rollout = client.rollout;
  const original = rollout.makeBidiStreamRequest.bind(rollout);
  rollout.makeBidiStreamRequest = ((path: string, serialize: (v: unknown) => Buffer, deserialize: (b: Buffer) => unknown, ...rest: unknown[]) =>
    (original as (...args: unknown[]) => unknown)(
      path,
      (value: unknown) => {
        const bytes = serialize(value);
        const request = RolloutRequest.decode(bytes);
        if (request.kind?.$case === 'task') sends.set(request.kind.value.taskId, (sends.get(request.kind.value.taskId) ?? 0) + 1);
        return bytes;
      },
      deserialize,
      ...rest,
    )) as typeof rollout.makeBidiStreamRequest;
  return { client, sends };
}

/** Reads a session in the background; with `hold`, each trajectory is acked only once the gate opens (manual acks). */
function consume(session: RolloutSession, hold?: Promise<void>): { got: string[]; done: Promise<void> } {
  const got: string[] = [];
  const done = (async () => {
    for await (const t of session.trajectories()) {
      got.push(key(t));
      if (hold) {
        await hold;
        session.ack([{ taskId: t.taskId, sampleIndex: t.sampleIndex }]);
      }
    }
  })();
  done.catch(() => undefined);
  return { got, done };
}

/**
 * How a submit waiting on a refusal ends when its stream goes: with its refusal while it waited for its retry, or with
 * the stream's CANCELLED when the spec was on its way again (its answer unknown: submit it again, on a new session).
 */
function endedWithStream(err: unknown, taskId: string): void {
  if (err instanceof TaskRejectedError) expect(err).toMatchObject({ taskId, code: status.RESOURCE_EXHAUSTED, retryable: true });
  else expect(err).toMatchObject({ code: status.CANCELLED });
}

describe('temporary refusals, against a real server whose sessions hold one unacked trajectory at a time', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    // 1 byte: one unacked trajectory at a time (one alone always fits); a new task is refused while delivery is paused.
    h = await startServerHarness({
      engine: { policy: () => 'done' },
      sandboxes: new NullSandboxDriver(),
      registry: defaultRegistry().register(counted),
      config: { sessions: { maxUnackedBytes: 1 } },
    });
  });
  afterAll(async () => h?.close());

  const paused = (sessionId: string): Promise<void> => eventually(() => h.server.sessions.get(sessionId)?.deliveryPaused === true, `delivery to ${sessionId} paused`, 20_000);

  it('a trainer that submits its batch before it reads (autoAck): every submit is accepted, each task runs once and arrives once', async () => {
    const { client, sends } = countingClient(h.server.address);
    try {
      const s = client.openSession({ sessionId: 'batch-first' });
      await s.submit(task('bf-0', 2));
      await paused('batch-first');
      // Refused (delivery paused) and submitted again: what the client holds is acked early so the pause lifts.
      const ids = Array.from({ length: 6 }, (_, i) => `bf-${i + 1}`);
      const accepted = await within(Promise.all(ids.map((id) => s.submit(task(id, 2)))), 30_000, 'the batch to be accepted');
      expect(accepted.map((a) => a.taskId)).toEqual(ids);
      expect(s.stats.rejectionsRetried).toBeGreaterThan(0);
      expect(s.stats.ackedEarly).toBeGreaterThan(0);
      expect(Math.max(...ids.map((id) => sends.get(id) ?? 0))).toBeGreaterThan(1); // some were refused and sent again
      s.close();
      const out = consume(s);
      await within(out.done, 30_000, 'the session to deliver everything');
      const expected = ['bf-0', ...ids].flatMap((id) => [`${id}#0`, `${id}#1`]);
      expect(out.got.sort()).toEqual(expected.sort()); // each once
      for (const id of ['bf-0', ...ids]) expect(runs.get(id)).toBe(2); // each sample ran once: a retry never ran a task twice
    } finally {
      client.close();
    }
  }, 60_000);

  it('a temporary refusal is retried with backoff until retryRejectedForMs, then rejects with the refusal; a permanent one rejects at once', async () => {
    const { client, sends } = countingClient(h.server.address);
    try {
      const s = client.openSession({ sessionId: 'budget', autoAck: false, retryRejectedForMs: 1_500 });
      const never = gate(); // the caller acks nothing until the end: the pause stays
      const out = consume(s, never.promise);
      await s.submit(task('bu-0', 2));
      await paused('budget');
      const started = performance.now();
      const refused = await within(s.submit(task('bu-late')).catch((e: unknown) => e), 10_000, 'the refusal');
      const elapsed = performance.now() - started;
      expect(refused).toBeInstanceOf(TaskRejectedError);
      expect(refused).toMatchObject({ code: status.RESOURCE_EXHAUSTED, retryable: true });
      expect((refused as TaskRejectedError).reason).toMatch(/paused/);
      // Sent at 0, 50, 150, 350 and 750 ms; the next wait (800 ms) would end past the 1.5 s budget: five sends, no spin.
      expect(elapsed).toBeGreaterThan(700);
      expect(elapsed).toBeLessThan(1_500 + 1_000);
      expect(sends.get('bu-late')).toBeGreaterThanOrEqual(4);
      expect(sends.get('bu-late')).toBeLessThanOrEqual(6);
      expect(s.stats.rejectionsRetried).toBe(sends.get('bu-late')! - 1);
      expect(s.stats.ackedEarly).toBe(0); // manual acks: nothing acked behind the caller's back
      expect(runs.get('bu-late')).toBeUndefined();
      s.abort();
      never.open();
      await within(out.done.catch(() => undefined), 5_000, 'the aborted loop to end');

      // A spec the server refuses for good (unknown environment) is not retried, whatever the budget.
      const p = client.openSession({ sessionId: 'permanent', retryRejectedForMs: 60_000 });
      const t0 = performance.now();
      const bad = await within(p.submit({ taskId: 'pm-bad', environment: 'no-such-env', numSamples: 1, instance: {} }).catch((e: unknown) => e), 5_000, 'the permanent refusal');
      expect(bad).toBeInstanceOf(TaskRejectedError);
      expect(bad).toMatchObject({ retryable: false });
      expect(performance.now() - t0).toBeLessThan(1_000);
      expect(sends.get('pm-bad')).toBe(1);
      p.close();
      await within(consume(p).done, 10_000, 'the permanent session to end');
    } finally {
      client.close();
    }
  }, 60_000);

  it('cancel() during the retry wait rejects the submit at once with its refusal; the spec is never sent again and the task never runs', async () => {
    const { client, sends } = countingClient(h.server.address);
    try {
      const s = client.openSession({ sessionId: 'cancel-wait', autoAck: false });
      const ackGate = gate();
      const out = consume(s, ackGate.promise);
      await s.submit(task('cw-0', 2));
      await paused('cancel-wait');
      let settled = false;
      const waiting = s.submit(task('cw-x')).finally(() => (settled = true));
      waiting.catch(() => undefined);
      await eventually(() => (sends.get('cw-x') ?? 0) >= 2, 'the refused spec to be sent again');
      expect(settled).toBe(false); // waiting for its retry (the default budget is 60 s)
      const t0 = performance.now();
      s.cancel('cw-x');
      const err = await within(waiting.catch((e: unknown) => e), 1_000, 'the cancelled submit');
      expect(performance.now() - t0).toBeLessThan(500);
      expect(err).toBeInstanceOf(TaskRejectedError);
      expect(err).toMatchObject({ taskId: 'cw-x', code: status.RESOURCE_EXHAUSTED });
      const sentBefore = sends.get('cw-x');
      // Acks lift the pause: a retry still scheduled would now be accepted and run.
      ackGate.open();
      await eventually(() => h.server.sessions.get('cancel-wait')?.deliveryPaused === false, 'delivery resumed', 20_000);
      await new Promise((r) => setTimeout(r, 2_500)); // longer than the largest backoff (2 s)
      expect(sends.get('cw-x')).toBe(sentBefore);
      expect(runs.get('cw-x')).toBeUndefined();
      expect(h.server.runtime.store.get('cw-x')).toBeUndefined();
      s.close();
      await within(out.done, 15_000, 'the session to end');
      expect(out.got.sort()).toEqual(['cw-0#0', 'cw-0#1']);
    } finally {
      client.close();
    }
  }, 60_000);

  it('leaving the trajectory loop during the retry wait rejects the submit with its refusal; nothing is sent after', async () => {
    const { client, sends } = countingClient(h.server.address);
    try {
      const s = client.openSession({ sessionId: 'loop-left', autoAck: false });
      const leave = gate();
      const loop = (async () => {
        for await (const _ of s.trajectories()) {
          void _;
          await leave.promise;
          break; // the trainer's loop throws or breaks: the call is cancelled
        }
      })();
      await s.submit(task('ll-0', 2));
      await paused('loop-left');
      const waiting = s.submit(task('ll-x'));
      waiting.catch(() => undefined);
      await eventually(() => (sends.get('ll-x') ?? 0) >= 2, 'the refused spec to be sent again');
      leave.open();
      await within(loop, 5_000, 'the loop to end');
      endedWithStream(await within(waiting.catch((e: unknown) => e), 1_000, 'the waiting submit to end with the loop'), 'll-x');
      const sentAtEnd = sends.get('ll-x');
      await new Promise((r) => setTimeout(r, 2_500)); // longer than the largest backoff
      expect(sends.get('ll-x')).toBe(sentAtEnd);
      expect(runs.get('ll-x')).toBeUndefined();
    } finally {
      client.close();
    }
  }, 60_000);

  it('close() during the retry wait: the submit made before it still completes, its trajectory comes, and the stream ends cleanly', async () => {
    const { client, sends } = countingClient(h.server.address);
    onTestFinished(() => client.close());
    const s = client.openSession({ sessionId: 'close-wait', autoAck: false });
    const ackGate = gate();
    const out = consume(s, ackGate.promise);
    await s.submit(task('clw-0', 2));
    await paused('close-wait');
    const late = s.submit(task('clw-late'));
    late.catch(() => undefined);
    await eventually(() => (sends.get('clw-late') ?? 0) >= 2, 'the refused spec to be sent again');
    s.close();
    ackGate.open(); // the caller acks what it got: the pause lifts, the retry is accepted
    const accepted = await within(late, 15_000, 'the late submit to be accepted');
    expect(accepted).toMatchObject({ taskId: 'clw-late', numSamples: 1 });
    await within(out.done, 15_000, 'the stream to end after the last trajectory');
    expect(out.got.sort()).toEqual(['clw-0#0', 'clw-0#1', 'clw-late#0']);
    expect(runs.get('clw-late')).toBe(1);
    // Everything acked, the half-close sent: the server closed the session (nothing left to resume).
    await eventually(() => h.server.sessions.get('close-wait') === undefined, 'the session closed');
  }, 60_000);

  it('a stream that breaks during the retry wait rejects the submit with its refusal; submitted on the resumed session it runs once', async () => {
    const { client, sends } = countingClient(h.server.address);
    try {
      const s1 = client.openSession({ sessionId: 'break-wait', autoAck: false });
      const never = gate();
      const c1 = consume(s1, never.promise);
      await s1.submit(task('bw-0', 2));
      await paused('break-wait');
      const waiting = s1.submit(task('bw-x'));
      waiting.catch(() => undefined);
      await eventually(() => (sends.get('bw-x') ?? 0) >= 2, 'the refused spec to be sent again');
      s1.abort(); // the trainer's connection breaks
      endedWithStream(await within(waiting.catch((e: unknown) => e), 1_000, 'the waiting submit to end with the stream'), 'bw-x');
      never.open();
      await within(c1.done.catch(() => undefined), 5_000, 'the broken loop to end');
      const sentOnFirst = sends.get('bw-x')!;
      await eventually(() => h.server.sessions.get('break-wait')?.isAttached === false, 'detach');
      await new Promise((r) => setTimeout(r, 2_500)); // longer than the largest backoff (2 s)
      expect(sends.get('bw-x')).toBe(sentOnFirst); // no timer of the broken stream sent it again

      // The trainer resumes the session and submits again what it has no answer for: bw-0 is owed, bw-x runs once.
      const s2 = client.openSession({ sessionId: 'break-wait', resume: true });
      await s2.opened;
      const again = await within(s2.submit(task('bw-0', 2)), 15_000, 'bw-0 re-sent');
      expect(again.alreadyOwed).toBe(true);
      await within(s2.submit(task('bw-x')), 15_000, 'bw-x on the resumed session');
      const sentAtAccept = sends.get('bw-x')!;
      expect(sentAtAccept).toBeGreaterThan(sentOnFirst);
      s2.close();
      const got = await within(collect(s2.trajectories()), 20_000, 'the resumed session to end');
      expect(new Set(got.map(key))).toEqual(new Set(['bw-0#0', 'bw-0#1', 'bw-x#0']));
      expect(got.filter((t) => t.taskId === 'bw-x')).toHaveLength(1);
      expect(runs.get('bw-x')).toBe(1);
      expect(runs.get('bw-0')).toBe(2);
      expect(sends.get('bw-x')).toBe(sentAtAccept); // accepted: never sent again
    } finally {
      client.close();
    }
  }, 60_000);
});

describe('a refusal while the server drains (UNAVAILABLE)', () => {
  it('is retried while the stream lives; when the drained server ends the stream the submit rejects with the refusal, never run', async () => {
    // One sample admitted at a time; 300 ms per token keeps the first one running while the second waits for admission.
    const h = await startServerHarness({
      engine: { policy: () => 'done', tokenLatencyMs: 300 },
      sandboxes: new NullSandboxDriver(),
      registry: defaultRegistry().register(counted),
      config: { maxAdmitted: 1, drainGraceMs: 60_000 },
    });
    const { client, sends } = countingClient(h.server.address);
    try {
      const s = client.openSession({ sessionId: 'draining' });
      await s.submit(task('dr-1'));
      const second = s.submit(task('dr-2'));
      second.catch(() => undefined);
      await eventually(() => h.server.runtime.admission.waiting === 1, 'dr-2 to wait for admission', 30_000);
      const got: string[] = [];
      const iterated = (async () => {
        for await (const t of s.trajectories()) got.push(key(t));
      })().catch((e: unknown) => e);
      const drained = h.server.drain();
      await eventually(() => (sends.get('dr-2') ?? 0) >= 2, 'the refused spec to be sent again while draining', 30_000);
      const refused = await within(second.catch((e: unknown) => e), 60_000, 'the refused submit to end with the stream');
      expect(refused).toBeInstanceOf(TaskRejectedError);
      expect(refused).toMatchObject({ taskId: 'dr-2', code: status.UNAVAILABLE, retryable: true });
      expect((refused as TaskRejectedError).reason).toMatch(/draining/);
      await within(drained, 60_000, 'the drain');
      const ended = (await within(iterated, 30_000, 'the loop to end')) as { code?: number } | undefined;
      expect(ended?.code).toBe(status.UNAVAILABLE);
      expect(got).toEqual(['dr-1#0']);
      expect(runs.get('dr-2')).toBeUndefined();
      const sentAtEnd = sends.get('dr-2');
      await new Promise((r) => setTimeout(r, 2_500)); // no timer outlives the stream
      expect(sends.get('dr-2')).toBe(sentAtEnd);
    } finally {
      client.close();
      await h.close();
    }
  }, 120_000);
});
