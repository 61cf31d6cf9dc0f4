import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { InjectedFailure } from '../../src/testing/fake-vllm.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { liveSandboxes, startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { eventually, within } from '../support/wait.js';
import { startEngineChild, type EngineChild } from './engine-child.js';
import type { TaskInput } from '../../src/client/rollout-client.js';

// Engine faults against a real server (bubblewrap sandboxes, gRPC on 127.0.0.1:0) whose engines are fake vLLMs
// (test doubles) speaking the real HTTP API: one in a child process that is killed -9 mid-turn, one in-process
// with injected faults (500, garbage bodies, no answer, a slow answer then a dropped connection). Every case ends
// with one truthful trajectory per sample — COMPLETED/TRUNCATED when another attempt or engine served it,
// BACKEND_ERROR with the cause otherwise, never a COMPLETED with reward 0 — within a stated bound, and the server
// keeps serving: a task after the fault completes.
//
// Bounds: each is the server's own budget for the case (acquire timeout, request timeout × attempts) plus a
// generous allowance for a loaded 2-core CI box (sandbox start, tokenizer work); the point is "ends, never hangs".

const S = TrajectoryStatus;
const OK = new Set([S.TRAJECTORY_STATUS_COMPLETED, S.TRAJECTORY_STATUS_TRUNCATED]);
const name = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex} ${TrajectoryStatus[t.status]} ${t.error}`;
/** Slack for sandbox start, tokenization and eval on a busy box, over the budget a case states. */
const SLACK_MS = 20_000;

function expectBackendError(t: Trajectory, errorPattern: RegExp): void {
  expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_BACKEND_ERROR');
  expect(t.reward).toBe(0);
  expect(t.rewardDetails).toEqual({});
  expect(t.finishReason).toBe('error');
  expect(t.error).toMatch(errorPattern);
  expect(invariantViolations(t)).toEqual([]);
}

function expectOk(t: Trajectory): void {
  expect(OK.has(t.status), name(t)).toBe(true);
  expect(invariantViolations(t)).toEqual([]);
}

/** Every sandbox of the faulted samples was released (their cgroups removed) once the trajectories are out. */
async function expectNoSandboxLeft(): Promise<void> {
  await eventually(async () => (await liveSandboxes()).length === 0, 'every sandbox to be released', SLACK_MS);
}

/** Runs one task on its own stream; every sample must be accounted for exactly once, within `boundMs`. */
async function runTask(h: ServerHarness, task: TaskInput, boundMs: number): Promise<Trajectory[]> {
  const run = (async () => {
    const session = h.client.openSession();
    await session.submit(task);
    session.close();
    return collect(session.trajectories());
  })();
  const out = await within(run, boundMs, `task ${task.taskId}`);
  expect(out.map((t) => t.sampleIndex).sort((a, b) => a - b)).toEqual([...Array(task.numSamples ?? 1).keys()]);
  return out;
}

describe('an engine process killed -9 mid-turn', () => {
  const children: EngineChild[] = [];
  const harnesses: ServerHarness[] = [];
  afterEach(async () => {
    for (const c of children.splice(0)) await c.kill9();
    for (const h of harnesses.splice(0)) await h.close();
  });

  it('with another engine: the trajectories on it move there and complete; none is lost, none fabricated', async () => {
    // ~30 tokens per turn at 40 ms a token: the child is surely mid-turn when killed.
    const child = await startEngineChild(40);
    children.push(child);
    const answers: number[][] = [];
    const h = await startServerHarness({
      config: { backends: [{ url: child.url, maxConcurrency: 64 }], backendAcquireTimeoutMs: 5_000 },
      engine: { onCompletion: (c) => answers.push([...c.tokenIds]) },
    });
    harnesses.push(h);
    const session = h.client.openSession();
    await session.submit(mathTask('killed-engine', 6, 6001));
    // Only the child is known at first, so every sample is pinned to it; the survivor joins once they are running.
    await eventually(async () => (await h.client.listBackends()).some((b) => b.url === child.url && b.inflightRequests > 0), 'requests on the child engine', 30_000);
    await h.client.addBackend({ url: h.engine.url, maxConcurrency: 64 });
    const killedAt = Date.now();
    await child.kill9();
    session.close();
    const trajectories = await within(collect(session.trajectories()), 5_000 + SLACK_MS, 'trajectories after the kill');
    const tookMs = Date.now() - killedAt;
    expect(trajectories.map((t) => t.sampleIndex).sort()).toEqual([0, 1, 2, 3, 4, 5]);
    for (const t of trajectories) expectOk(t);
    // Every sampled turn after the kill came from the survivor, and each is exactly one answer it gave.
    const [survivor] = (await h.client.listBackends()).filter((b) => b.url === h.engine.url);
    for (const t of trajectories) {
      const last = t.turns.filter((turn) => turn.backend !== '').at(-1)!;
      expect(last.backend, name(t)).toBe(survivor!.id);
      const ids = t.responseTokenIds.slice(last.start, last.end);
      expect(answers.some((a) => a.length === ids.length && a.every((x, i) => x === ids[i])), name(t)).toBe(true);
    }
    expect(tookMs).toBeLessThan(5_000 + SLACK_MS);
    console.log(`engine killed -9 with another engine: all 6 samples done ${tookMs} ms after the kill`);
    await expectNoSandboxLeft();
    const [after] = await runTask(h, mathTask('after-kill', 1, 6002), SLACK_MS);
    expectOk(after!);
  });

  it('alone: BACKEND_ERROR naming the loss once the acquire timeout passes, never a hang or a reward', async () => {
    const child = await startEngineChild(40);
    children.push(child);
    const h = await startServerHarness({ config: { backends: [{ url: child.url, maxConcurrency: 64 }], backendAcquireTimeoutMs: 1_000 } });
    harnesses.push(h);
    const session = h.client.openSession();
    await session.submit(mathTask('killed-alone', 3, 6003));
    await eventually(async () => (await h.client.listBackends()).some((b) => b.inflightRequests > 0), 'requests on the child engine', 30_000);
    const killedAt = Date.now();
    await child.kill9();
    session.close();
    // Bound: the 1 s acquire timeout for another backend (per sample, concurrently), plus slack.
    const trajectories = await within(collect(session.trajectories()), 1_000 + SLACK_MS, 'trajectories after the kill');
    console.log(`engine killed -9 alone: 3 BACKEND_ERRORs ${Date.now() - killedAt} ms after the kill`);
    expect(trajectories.map((t) => t.sampleIndex).sort()).toEqual([0, 1, 2]);
    for (const t of trajectories) expectBackendError(t, /backend_error: .*(lost .*found no other backend|unreachable|unhealthy)/);
    await expectNoSandboxLeft();
  });
});

describe('an engine answering wrongly', () => {
  let h: ServerHarness;
  /** The fault every completion request gets while set (each test sets it, runs, clears it). */
  let fault: InjectedFailure | undefined;
  beforeAll(async () => {
    h = await startServerHarness({ config: { backendRequestTimeoutMs: 1_000 }, engine: { inject: () => fault } });
  });
  afterAll(async () => h?.close());
  afterEach(async () => {
    fault = undefined;
    await expectNoSandboxLeft();
    // The server still serves: the next task completes.
    const [t] = await runTask(h, mathTask('after-fault', 1, 6100), SLACK_MS);
    expectOk(t!);
  });

  it('HTTP 500 on every request: BACKEND_ERROR with the engine\u2019s message, at once (a 500 is an answer, not a lost engine)', async () => {
    fault = { kind: 'status', status: 500, message: 'CUDA error: device-side assert triggered' };
    const trajectories = await runTask(h, mathTask('always-500', 3, 6101), SLACK_MS);
    for (const t of trajectories) expectBackendError(t, /HTTP 500.*CUDA error: device-side assert triggered/);
  });

  const garbage: Record<string, string> = {
    'not JSON': '<html><body>502 Bad Gateway</body></html>',
    'truncated JSON': '{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"The ans',
    'empty body': '',
    'JSON null': 'null',
    'an array': '[1,2,3]',
    'no choices': '{"id":"cmpl-1","object":"text_completion","choices":[]}',
    'choices not a list': '{"id":"cmpl-1","choices":{"0":{"text":"hi"}}}',
    'logprobs missing': '{"id":"cmpl-1","choices":[{"index":0,"text":"4","logprobs":null,"finish_reason":"stop"}]}',
    'tokens of the wrong type': '{"id":"cmpl-1","choices":[{"index":0,"text":"4","logprobs":{"tokens":[7,8],"token_logprobs":["a","b"]},"finish_reason":"stop"}]}',
    'token ids that are not ids': '{"id":"cmpl-1","choices":[{"index":0,"text":"4","logprobs":{"tokens":["token_id:-1","token_id:x"],"token_logprobs":[-0.1,-0.2]},"finish_reason":"stop"}]}',
    'lists of different lengths': '{"id":"cmpl-1","choices":[{"index":0,"text":"4","logprobs":{"tokens":["token_id:19"],"token_logprobs":[-0.1,-0.2]},"finish_reason":"stop"}]}',
    // What Python's json.dumps writes for a NaN: not JSON.
    'NaN logprob': '{"id":"cmpl-1","choices":[{"index":0,"text":"4","logprobs":{"tokens":["token_id:19"],"token_logprobs":[NaN]},"finish_reason":"stop"}]}',
    'unknown finish reason': '{"id":"cmpl-1","choices":[{"index":0,"text":"4","logprobs":{"tokens":["token_id:19"],"token_logprobs":[-0.1]},"finish_reason":"exploded"}]}',
  };
  for (const [what, body] of Object.entries(garbage)) {
    it(`a 200 whose body is ${what}: BACKEND_ERROR, nothing of it in the trajectory`, async () => {
      fault = { kind: 'garbage', body };
      const trajectories = await runTask(h, mathTask(`garbage-${what.replaceAll(' ', '-')}`, 2, 6102), SLACK_MS);
      for (const t of trajectories) {
        expectBackendError(t, /^backend_error: vLLM http:\/\/127\.0\.0\.1:\d+ sent a malformed completion: ./);
        expect(t.responseMask.every((m) => m === 0), name(t)).toBe(true);
      }
    });
  }

  it('no answer at all (the connection is accepted, nothing comes back): BACKEND_ERROR after the request timeout', async () => {
    fault = { kind: 'hang' };
    const started = Date.now();
    const trajectories = await runTask(h, mathTask('never', 2, 6103), 4 * 1_000 + SLACK_MS);
    // Bound: backendRequestTimeoutMs (1 s) for each attempt the pool makes (at most 1 + maxFailoversPerRequest = 4).
    for (const t of trajectories) expectBackendError(t, /backend_error: .*(timed out|timeout)/i);
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_000);
  });

  it('a slow answer whose connection then drops: sent again, and BACKEND_ERROR naming the loss when it drops every time', async () => {
    fault = { kind: 'slowDrop', afterMs: 200, partial: '{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"The ans' };
    const trajectories = await runTask(h, mathTask('slow-drop', 2, 6104), SLACK_MS);
    for (const t of trajectories) expectBackendError(t, /backend_error: .*lost its backend 4 times/);
  });

  it('a slow answer that drops once: the retry\u2019s answer alone is kept', async () => {
    const before = h.engine.stats();
    h.engine.failNext(1, { kind: 'slowDrop', afterMs: 200, partial: '{"id":"cmpl-1","choices":[{"text":"par' });
    const [t] = await runTask(h, mathTask('slow-drop-once', 1, 6105), SLACK_MS);
    expectOk(t!);
    const after = h.engine.stats();
    expect(after.failed - before.failed).toBe(1);
    // The dropped request was asked again: one more request than the turns that were answered.
    expect(after.received - before.received).toBe(after.served - before.served + 1);
  });
});
