import { status, type ServiceError } from '@grpc/grpc-js';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startRolloutServer } from '../../src/app.js';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { RolloutError } from '../../src/errors.js';
import { silentLogger } from '../../src/observability/logger.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { FakeVllmEngine, type FakeVllmOptions } from '../../src/testing/fake-vllm.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { createScriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';
import { BackendKind, CapacitySource, LogprobsMode } from '../../gen/ts/rollout/v1/backend.js';
import { TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness, type ServerHarnessOptions } from '../support/server-harness.js';

/**
 * What engines say about how they run, end to end through the contract: AddBackend and the config learn the logprobs
 * mode and capacity from the fake engines (test doubles serving vLLM's dev-mode /server_info and SGLang's
 * /get_server_info as the real ones do), ListBackends shows them with where the capacity came from, declared modes
 * are checked against the engine, and every trajectory records the mode of the engines that sampled it.
 */

const policy = createScriptedMathPolicy({ wrongAnswerRate: 0, malformedToolCallRate: 0 });
let tokenizer: Tokenizer;
const cleanups: Array<() => Promise<void>> = [];

beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
});

afterEach(async () => {
  for (const close of cleanups.splice(0).reverse()) await close();
});

async function vllm(options: Partial<FakeVllmOptions> = {}): Promise<FakeVllmEngine> {
  const engine = await FakeVllmEngine.start({ tokenizer, policy, tokenLatencyMs: 0, ...options });
  cleanups.push(() => engine.close());
  return engine;
}

async function harness(options: ServerHarnessOptions): Promise<ServerHarness> {
  const h = await startServerHarness({ ...options, engine: { policy, ...options.engine } });
  cleanups.push(() => h.close());
  return h;
}

async function run(h: ServerHarness, task: TaskInput): Promise<Trajectory[]> {
  const session = h.client.openSession();
  await session.submit(task);
  session.close();
  return collect(session.trajectories());
}

async function refusal(promise: Promise<unknown>): Promise<ServiceError> {
  return (await promise.then(
    () => expect.fail('expected the call to fail'),
    (e: unknown) => e,
  )) as ServiceError;
}

describe('AddBackend and ListBackends: logprobs mode and capacity', () => {
  it("learns both from a vLLM in dev mode when max_concurrency is 0 and no mode is declared", async () => {
    const engine = await vllm({ maxNumSeqs: 48, logprobsMode: 'processed_logprobs' });
    const h = await harness({ config: { backends: [] } });
    const added = await h.client.addBackend({ url: engine.url, id: 'dev' });
    const expected = { id: 'dev', maxConcurrency: 48, capacitySource: CapacitySource.CAPACITY_SOURCE_ENGINE, logprobsMode: LogprobsMode.LOGPROBS_MODE_PROCESSED };
    expect(added).toMatchObject(expected);
    expect(await h.client.listBackends()).toEqual([expect.objectContaining(expected)]);
  });

  it('keeps a configured capacity, and falls back to the default (and a declared mode) on a production vLLM', async () => {
    const dev = await vllm({ maxNumSeqs: 48 });
    const production = await vllm({ devMode: false });
    const h = await harness({ config: { backends: [] } });
    expect(await h.client.addBackend({ url: dev.url, id: 'configured', maxConcurrency: 5 })).toMatchObject({
      maxConcurrency: 5, capacitySource: CapacitySource.CAPACITY_SOURCE_CONFIGURED, logprobsMode: LogprobsMode.LOGPROBS_MODE_PROCESSED,
    });
    expect(await h.client.addBackend({ url: production.url, id: 'silent' })).toMatchObject({
      maxConcurrency: 256, capacitySource: CapacitySource.CAPACITY_SOURCE_DEFAULT, logprobsMode: LogprobsMode.LOGPROBS_MODE_UNSPECIFIED,
    });
    expect(await h.client.addBackend({ url: production.url, id: 'declared', logprobsMode: LogprobsMode.LOGPROBS_MODE_RAW })).toMatchObject({
      logprobsMode: LogprobsMode.LOGPROBS_MODE_RAW,
    });
  });

  it('refuses a declared mode the engine contradicts and a MIXED declaration (INVALID_ARGUMENT naming logprobs_mode), keeping neither', async () => {
    const engine = await vllm({ logprobsMode: 'processed_logprobs' });
    const logits = await vllm({ logprobsMode: 'raw_logits' });
    const h = await harness({ config: { backends: [] } });
    const contradicted = await refusal(h.client.addBackend({ url: engine.url, id: 'wrong', logprobsMode: LogprobsMode.LOGPROBS_MODE_RAW }));
    expect(contradicted.code).toBe(status.INVALID_ARGUMENT);
    expect(contradicted.details).toMatch(/logprobs_mode.*declared raw.*reports processed/);
    const mixed = await refusal(h.client.addBackend({ url: engine.url, id: 'mixed', logprobsMode: LogprobsMode.LOGPROBS_MODE_MIXED }));
    expect(mixed.code).toBe(status.INVALID_ARGUMENT);
    expect(mixed.details).toContain('logprobs_mode');
    const refusedLogits = await refusal(h.client.addBackend({ url: logits.url, id: 'logits' }));
    expect(refusedLogits.code).toBe(status.FAILED_PRECONDITION);
    expect(refusedLogits.details).toContain('raw_logits');
    expect(await h.client.listBackends()).toEqual([]);
  });

  it('learns an SGLang engine\'s capacity from /get_server_info; its mode only when declared', async () => {
    const engine = await FakeSglangEngine.start({ tokenizer, model: 'fake-qwen3', policy, maxRunningRequests: 24, dpSize: 2 });
    cleanups.push(() => engine.close());
    const h = await harness({ config: { backends: [] } });
    expect(await h.client.addBackend({ url: engine.url, kind: BackendKind.BACKEND_KIND_SGLANG, id: 'sg' })).toMatchObject({
      maxConcurrency: 48, capacitySource: CapacitySource.CAPACITY_SOURCE_ENGINE, logprobsMode: LogprobsMode.LOGPROBS_MODE_UNSPECIFIED,
    });
    expect(
      await h.client.addBackend({ url: engine.url, kind: BackendKind.BACKEND_KIND_SGLANG, id: 'sg-declared', logprobsMode: LogprobsMode.LOGPROBS_MODE_PROCESSED }),
    ).toMatchObject({ logprobsMode: LogprobsMode.LOGPROBS_MODE_PROCESSED });
  });
});

describe('Trajectory.logprobs_mode', () => {
  const modeOf = async (h: ServerHarness, taskId: string): Promise<LogprobsMode[]> => {
    const group = await run(h, mathTask(taskId, 2, 4100));
    for (const t of group) {
      expect(TrajectoryStatus[t.status]).toBe('TRAJECTORY_STATUS_COMPLETED');
      expect(invariantViolations(t)).toEqual([]);
    }
    return group.map((t) => t.logprobsMode);
  };

  it('is the mode of the engine that sampled it: PROCESSED, RAW, or UNSPECIFIED when the engine does not say', async () => {
    const processed = await harness({ engine: { logprobsMode: 'processed_logprobs' } });
    expect(await modeOf(processed, 'processed')).toEqual([LogprobsMode.LOGPROBS_MODE_PROCESSED, LogprobsMode.LOGPROBS_MODE_PROCESSED]);
    const raw = await harness({ engine: { logprobsMode: 'raw_logprobs' } });
    expect(await modeOf(raw, 'raw')).toEqual([LogprobsMode.LOGPROBS_MODE_RAW, LogprobsMode.LOGPROBS_MODE_RAW]);
    const silent = await harness({ engine: { devMode: false } });
    expect(await modeOf(silent, 'silent')).toEqual([LogprobsMode.LOGPROBS_MODE_UNSPECIFIED, LogprobsMode.LOGPROBS_MODE_UNSPECIFIED]);
  });
});

describe('config backends[].logprobsMode', () => {
  it('declares the mode of an engine that does not say, and stops the start when the engine contradicts it', async () => {
    const production = await vllm({ devMode: false });
    const server = await startRolloutServer(
      { port: 0, model: production.model, backends: [{ url: production.url, logprobsMode: 'processed' }] },
      { logger: silentLogger(), sandboxes: new NullSandboxDriver() },
    );
    cleanups.push(() => server.shutdown());
    expect(server.pool.list()).toEqual([expect.objectContaining({ logprobsMode: 'processed', capacitySource: 'default', maxConcurrency: 256 })]);

    const dev = await vllm({ logprobsMode: 'processed_logprobs' });
    const failed = await startRolloutServer(
      { port: 0, model: dev.model, backends: [{ url: dev.url, logprobsMode: 'raw' }] },
      { logger: silentLogger(), sandboxes: new NullSandboxDriver() },
    ).then(
      async (s) => {
        await s.shutdown();
        return expect.fail('the server started');
      },
      (e: unknown) => e,
    );
    expect(failed).toBeInstanceOf(RolloutError);
    expect(failed).toMatchObject({ code: 'invalid_argument', field: 'backends.0.logprobsMode', message: expect.stringContaining('reports processed') as unknown });
  });
});
