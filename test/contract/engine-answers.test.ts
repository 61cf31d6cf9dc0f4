import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { TaskRejectedError, type TaskInput } from '../../src/client/rollout-client.js';
import { defaultRegistry } from '../../src/environments/registry.js';
import type { Environment } from '../../src/environments/types.js';
import { createLogger, type Logger } from '../../src/observability/logger.js';
import { calcPolicy, CALC_ENVIRONMENT, createCalcEnvironment } from '../../src/testing/calc-environment.js';
import { FakeVllmEngine, type FakeVllmOptions } from '../../src/testing/fake-vllm.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { hermesToolCall } from '../../src/testing/scripted-policy.js';
import { loadQwen3, qwen3ModelDir } from '../../src/tokens/tokenizer.js';
import { toolSchemas } from '../../src/tools/registry.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { limits, startServerHarness, type ServerHarness, type ServerHarnessOptions } from '../support/server-harness.js';

const S = TrajectoryStatus;
const OK = new Set([S.TRAJECTORY_STATUS_COMPLETED, S.TRAJECTORY_STATUS_TRUNCATED]);
const name = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex} ${TrajectoryStatus[t.status]} ${t.finishReason} ${t.error}`;

async function runTask(h: ServerHarness, task: TaskInput): Promise<Trajectory[]> {
  const session = h.client.openSession();
  await session.submit(task);
  session.close();
  return collect(session.trajectories());
}

function expectBackendError(t: Trajectory, reason: RegExp): void {
  expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_BACKEND_ERROR');
  expect(t.reward).toBe(0);
  expect(t.error).toMatch(reason);
  expect(invariantViolations(t)).toEqual([]);
}

const harnesses: ServerHarness[] = [];
async function harness(options: ServerHarnessOptions = {}): Promise<ServerHarness> {
  const h = await startServerHarness(options);
  harnesses.push(h);
  return h;
}
afterEach(async () => {
  for (const h of harnesses.splice(0)) await h.close();
});

/** The calc environment (in-process tool, no sandbox process) with a policy that calls `calc` forever. */
const endlessCalc = { policy: () => hermesToolCall('calc', { expression: '17 * 23 + 5' }) } satisfies Partial<FakeVllmOptions>;
function calcServer(engine: Partial<FakeVllmOptions>, extra: ServerHarnessOptions = {}): Promise<ServerHarness> {
  return harness({ registry: defaultRegistry().register(createCalcEnvironment()), sandboxes: new NullSandboxDriver(), engine, ...extra });
}
const calcInstance = { problem: 'What is 17 * 23 + 5?', answer: '396' };
function calcTask(taskId: string, extra: Partial<TaskInput> = {}): TaskInput {
  return { taskId, environment: CALC_ENVIRONMENT, numSamples: 1, instance: calcInstance, sampling: { temperature: 1, seed: 1, maxTokensPerTurn: 256, maxTotalTokens: 8192, stop: [] }, ...extra };
}

/** Tokens of the calc task's prompt, rendered as the ledger renders it. */
async function calcPromptTokens(): Promise<number> {
  const { tokenizer, template } = await loadQwen3();
  const env = createCalcEnvironment();
  const instance = env.validate(calcInstance);
  return tokenizer.encode(template.render(env.prompt!(instance), { addGenerationPrompt: true, tools: toolSchemas(env.tools(instance)) })).length;
}

describe('engine answers are checked before they become trajectories, and the server keeps serving', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness();
  });
  afterAll(async () => h?.close());

  it('token ids outside the tokenizer\u2019s vocabulary: BACKEND_ERROR naming the id, not COMPLETED with reward 0', async () => {
    h.engine.failNext(1, { kind: 'tamper', tamper: (choice) => ((choice.logprobs as { tokens: string[] }).tokens[0] = 'token_id:10000000') });
    const [t] = await runTask(h, mathTask('out-of-vocab', 1, 1101));
    expectBackendError(t!, /logprobs\.tokens\[0\] \(token_id\) = 10000000 is not an integer in \[0, 151669\)/);
    const [next] = await runTask(h, mathTask('after-out-of-vocab', 1, 1102));
    expect(OK.has(next!.status), name(next!)).toBe(true);
  });

  it('200,000 tokens for max_tokens 256: BACKEND_ERROR, not COMPLETED', async () => {
    h.engine.failNext(1, {
      kind: 'tamper',
      tamper: (choice) => {
        (choice.logprobs as { tokens: string[] }).tokens = Array.from({ length: 200_000 }, (_, i) => `token_id:${1000 + (i % 1000)}`);
        (choice.logprobs as { token_logprobs: number[] }).token_logprobs = Array.from({ length: 200_000 }, () => -0.25);
      },
    });
    const [t] = await runTask(h, mathTask('ignores-max-tokens', 1, 1103));
    expectBackendError(t!, /200000 token ids for max_tokens 256|larger than the \d+-byte cap/);
  });

  it('a logprob of +3.5: BACKEND_ERROR, not COMPLETED with reward 1', async () => {
    h.engine.failNext(1, { kind: 'tamper', tamper: (choice) => ((choice.logprobs as { token_logprobs: number[] }).token_logprobs[2] = 3.5) });
    const [t] = await runTask(h, mathTask('positive-logprob', 1, 1104));
    expectBackendError(t!, /token_logprobs\[2\] = 3.5 is positive/);
  });

  it('a 600 MiB answer does not take the server down: its sample is a BACKEND_ERROR, the others complete, the rest is never read', async () => {
    const before = h.engine.stats().oversizedBytesSent;
    h.engine.failNext(1, { kind: 'oversized', bytes: 600 << 20 });
    const group = await runTask(h, mathTask('huge-answer', 3, 1105));
    const failed = group.filter((t) => t.status === S.TRAJECTORY_STATUS_BACKEND_ERROR);
    expect(failed.map(name)).toHaveLength(1);
    expectBackendError(failed[0]!, /larger than the \d+-byte cap/);
    for (const t of group.filter((x) => x !== failed[0])) expect(OK.has(t.status), name(t)).toBe(true);
    expect(h.engine.stats().oversizedBytesSent - before).toBeLessThan(32 << 20);
    const [next] = await runTask(h, mathTask('after-huge-answer', 1, 1106));
    expect(OK.has(next!.status), name(next!)).toBe(true);
  });
});

describe('a model whose vocabulary is padded past the tokenizer\u2019s ids (config.json vocab_size)', () => {
  it('a sampled padding id is the policy\u2019s token (mask 1, its logprob), not BACKEND_ERROR; past the model\u2019s rows it still is', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'padded-vocab-'));
    try {
      cpSync(qwen3ModelDir(), dir, { recursive: true });
      writeFileSync(join(dir, 'config.json'), JSON.stringify({ architectures: ['Qwen3ForCausalLM'], vocab_size: 151_936 }));
      const h = await harness({ config: { model: { name: 'fake-qwen3', dir } } });
      h.engine.failNext(1, { kind: 'tamper', tamper: (choice) => ((choice.logprobs as { tokens: string[] }).tokens[0] = 'token_id:151935') });
      const [t] = await runTask(h, mathTask('padding-id', 1, 1111));
      expect(OK.has(t!.status), name(t!)).toBe(true);
      expect(t!.responseTokenIds[0]).toBe(151_935);
      expect(t!.responseMask[0]).toBe(1);
      expect(t!.responseLogprobs[0]).toBeLessThanOrEqual(0);
      expect(invariantViolations(t!)).toEqual([]);
      h.engine.failNext(1, { kind: 'tamper', tamper: (choice) => ((choice.logprobs as { tokens: string[] }).tokens[0] = 'token_id:151936') });
      const [past] = await runTask(h, mathTask('past-model-rows', 1, 1112));
      expectBackendError(past!, /logprobs\.tokens\[0\] \(token_id\) = 151936 is not an integer in \[0, 151936\)/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('the answer size cap is configurable (backendMaxResponseBytes)', () => {
  it('an answer past a 64 KiB cap fails only its sample while others run alongside', async () => {
    const capped = await harness({
      config: { backendMaxResponseBytes: 64 * 1024 },
      engine: { tokenLatencyMs: 2, inject: ({ body }) => (Number(body.seed) === 1201 + 1000 ? { kind: 'oversized', bytes: 4 << 20 } : undefined) },
    });
    const group = await runTask(capped, mathTask('capped', 4, 1201));
    expect(group).toHaveLength(4);
    for (const t of group) {
      if (t.sampleIndex === 1) expectBackendError(t, /larger than the 65536-byte cap/);
      else expect(OK.has(t.status), name(t)).toBe(true);
    }
  });
});

describe('running out of context is truncation, not an infrastructure failure', () => {
  it('each engine\u2019s max_model_len is learned when it is added (config and AddBackend) and listed', async () => {
    const h = await harness({ engine: { maxModelLen: 3000 } });
    expect((await h.client.listBackends()).map((b) => b.maxModelLen)).toEqual([3000]);
    const { tokenizer } = await loadQwen3();
    const second = await FakeVllmEngine.start({ tokenizer, model: h.engine.model, maxModelLen: 2500 });
    try {
      await h.client.addBackend({ url: second.url, maxConcurrency: 4, id: 'second' });
      const listed = await h.client.listBackends();
      expect(listed.find((b) => b.id === 'second')?.maxModelLen).toBe(2500);
      expect(h.server.pool.minMaxModelLen()).toBe(2500);
    } finally {
      await h.client.removeBackend('second');
      await second.close();
    }
  });

  it('a conversation that reaches max_model_len ends TRUNCATED with finish_reason max_model_len; no request exceeds it', async () => {
    const limit = (await calcPromptTokens()) + 150;
    const asked: number[] = [];
    const h = await calcServer({
      ...endlessCalc,
      maxModelLen: limit,
      inject: ({ body }) => void asked.push((body.prompt as number[]).length + (body.max_tokens as number)),
    });
    const [t] = await runTask(h, calcTask('reaches-limit', { limits: limits({ maxTurns: 30 }) }));
    expect(TrajectoryStatus[t!.status], name(t!)).toBe('TRAJECTORY_STATUS_TRUNCATED');
    expect(t!.finishReason).toBe('max_model_len');
    expect(t!.numTurns).toBeGreaterThanOrEqual(2);
    // Everything the engine was asked to hold fit; the environment's last answer (mask 0) may run past the limit,
    // which is what ended the loop.
    const lastAssistant = t!.turns.filter((turn) => turn.backend !== '').at(-1)!;
    expect(t!.promptTokenIds.length + lastAssistant.end).toBeLessThanOrEqual(limit);
    expect(invariantViolations(t!)).toEqual([]);
    expect(Math.max(...asked)).toBeLessThanOrEqual(limit);
    expect(h.engine.stats().failed).toBe(0);
  });

  it('an engine that never stated its limit: its context-length 400 is TRUNCATED (max_model_len), and the pool learns the limit from it', async () => {
    const limit = (await calcPromptTokens()) + 300;
    const h = await calcServer({ ...endlessCalc, maxModelLen: limit, listModels: false });
    expect(h.server.pool.list()[0]!.maxModelLen).toBeUndefined();
    const [t] = await runTask(h, calcTask('unknown-limit', { limits: limits({ maxTurns: 30 }) }));
    expect(TrajectoryStatus[t!.status], name(t!)).toBe('TRAJECTORY_STATUS_TRUNCATED');
    expect(t!.finishReason).toBe('max_model_len');
    expect(t!.numTurns).toBeGreaterThanOrEqual(1);
    expect(t!.error).toBe('');
    expect(invariantViolations(t!)).toEqual([]);
    expect(h.engine.stats().failed).toBe(1);
    expect((await h.client.listBackends())[0]!.maxModelLen).toBe(limit);
  });

  it('an engine whose /v1/models failed at add time has its limit learned after a later health probe', async () => {
    const h = await calcServer({ listModels: false, maxModelLen: 5000 });
    expect(h.server.pool.list()[0]!.maxModelLen).toBeUndefined();
    h.engine.setModelsListed(true);
    await h.server.pool.probeHealth();
    await expect.poll(() => h.server.pool.list()[0]!.maxModelLen).toBe(5000);
  });

  it('a prompt that alone fills the budget is rejected at admission (field instance), before any sandbox or engine work', async () => {
    const h = await harness({ engine: { maxModelLen: 200 } });
    const session = h.client.openSession();
    const overTotal = await session.submit(mathTask('prompt-over-total', 2, 1301, { sampling: { maxTokensPerTurn: 16, maxTotalTokens: 100, stop: [] } })).catch((e: unknown) => e);
    expect(overTotal).toBeInstanceOf(TaskRejectedError);
    expect((overTotal as TaskRejectedError).field).toBe('instance');
    expect((overTotal as TaskRejectedError).reason).toMatch(/prompt is \d+ tokens, budget is 100 = min\(max_total_tokens 100, smallest known max_model_len 200\)/);
    const overModel = await session.submit(mathTask('prompt-over-model', 1, 1302)).catch((e: unknown) => e);
    expect((overModel as TaskRejectedError).reason).toMatch(/budget is 200 = min\(max_total_tokens 4096, smallest known max_model_len 200\)/);
    session.close();
    expect(await collect(session.trajectories())).toEqual([]);
    expect(h.engine.stats().received).toBe(0);
  });

  it('an environment without the prompt hook: an over-budget prompt fails the sample INVALID_TASK before any engine request', async () => {
    const { prompt: _hook, ...calc } = createCalcEnvironment();
    const noHook: Environment<unknown> = { ...(calc as Environment<unknown>), name: 'calc-without-prompt-hook' };
    const h = await harness({ registry: defaultRegistry().register(noHook), sandboxes: new NullSandboxDriver(), engine: { policy: calcPolicy } });
    const trajectories = await runTask(h, calcTask('no-hook', { environment: noHook.name, numSamples: 2, sampling: { maxTokensPerTurn: 16, maxTotalTokens: 100, stop: [] } }));
    expect(trajectories).toHaveLength(2);
    for (const t of trajectories) {
      expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_INVALID_TASK');
      expect(t.error).toMatch(/instance: prompt is \d+ tokens, budget is 100 = min\(max_total_tokens 100, max_model_len 40960 of backend .*\)/);
      expect(t.numTurns).toBe(0);
    }
    expect(h.engine.stats().received).toBe(0);
  });
});

/** A pino logger writing JSON lines to memory. */
function captureLogs(): { logger: Logger; lines: () => Array<Record<string, unknown>> } {
  const chunks: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      chunks.push(chunk.toString('utf8'));
      done();
    },
  });
  return {
    logger: createLogger({ level: 'info', destination: sink }),
    lines: () => chunks.join('').split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as Record<string, unknown>),
  };
}

describe('every failed trajectory says why', () => {
  it('the engine\u2019s error body reaches Trajectory.error, bounded to 2 KiB of valid UTF-8', async () => {
    const h = await harness();
    h.engine.failNext(1, { kind: 'status', status: 400, message: `CUDA out of memory. ${'😀'.repeat(3000)}` });
    const [t] = await runTask(h, mathTask('explained', 1, 1401));
    expect(TrajectoryStatus[t!.status]).toBe('TRAJECTORY_STATUS_BACKEND_ERROR');
    expect(t!.error.startsWith(`backend_error: vLLM ${h.engine.url} answered HTTP 400: {"error":{"message":"CUDA out of memory. 😀`)).toBe(true);
    expect(Buffer.byteLength(t!.error)).toBeLessThanOrEqual(2048);
    expect(Buffer.byteLength(t!.error)).toBeGreaterThan(2000);
    expect(t!.error.endsWith('😀…')).toBe(true);
    expect(Buffer.from(t!.error, 'utf8').toString('utf8')).toBe(t!.error);
  });

  it('the server logs one line per failed trajectory: task, sample, status, backend of its last turn, cause', async () => {
    const logs = captureLogs();
    const promptTokens = await calcPromptTokens();
    // Every second turn fails: each sample has one sampled turn (on the backend) before its failure.
    const h = await calcServer(
      { policy: calcPolicy, inject: ({ body }) => ((body.prompt as number[]).length > promptTokens ? { kind: 'status', status: 500, message: 'engine fell over' } : undefined) },
      { logger: logs.logger },
    );
    const trajectories = await runTask(h, calcTask('logged', { numSamples: 3 }));
    expect(trajectories.map((t) => TrajectoryStatus[t.status])).toEqual(Array(3).fill('TRAJECTORY_STATUS_BACKEND_ERROR'));
    const lines = logs.lines().filter((l) => l.msg === 'trajectory failed');
    expect(lines).toHaveLength(3);
    const backend = (await h.client.listBackends())[0]!.id;
    expect(lines.map((l) => l.sample).sort()).toEqual([0, 1, 2]);
    for (const line of lines) {
      expect(line).toMatchObject({ task: 'logged', status: 'BACKEND_ERROR', backend, level: 40 });
      expect(line.cause).toMatch(/^backend_error: vLLM .* answered HTTP 500: .*engine fell over/);
    }
  });
});
