import { status, type ServiceError } from '@grpc/grpc-js';
import { createServer } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BackendKind } from '../../gen/ts/rollout/v1/backend.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { startRolloutServer } from '../../src/app.js';
import { RolloutError } from '../../src/errors.js';
import { silentLogger } from '../../src/observability/logger.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { NullSandboxDriver } from '../../src/testing/null-sandbox.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { collect, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';
import { within } from '../support/wait.js';

/**
 * An engine that serves another model than the backend's: vLLM refuses every completion naming a model it does not
 * serve (404), so such an engine is refused where it is added, by field, with the models it does serve — while an
 * engine that is not up yet is still added (what it serves is learned once it answers).
 */

let other: FakeVllmEngine;
let otherSglang: FakeSglangEngine;
beforeAll(async () => {
  const { tokenizer } = await loadQwen3();
  other = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 0, model: 'other-model', maxModelLen: 1234 });
  otherSglang = await FakeSglangEngine.start({ tokenizer, model: 'other-model' });
});
afterAll(async () => {
  await other?.close();
  await otherSglang?.close();
});

describe('AddBackend of an engine that does not serve the server\u2019s model', () => {
  let h: ServerHarness;
  beforeAll(async () => {
    h = await startServerHarness({ config: { backendRequestTimeoutMs: 5_000 } });
  });
  afterAll(async () => h?.close());

  // Regression: AddBackend took another model's only card and succeeded; every trajectory routed there was BACKEND_ERROR (404).
  it('vLLM: refused INVALID_ARGUMENT naming model and the models it serves; nothing is added, and no trajectory fails', async () => {
    const err = (await h.client.addBackend({ url: other.url, maxConcurrency: 256 }).then(
      () => expect.fail('expected AddBackend to be refused'),
      (e: unknown) => e,
    )) as ServiceError;
    expect({ code: status[err.code], field: err.metadata.get('rollout-field')[0] }).toEqual({ code: 'INVALID_ARGUMENT', field: 'model' });
    expect(err.details).toBe(`model: vLLM ${other.url} does not serve model "${h.engine.model}" (GET /v1/models: it serves "other-model")`);
    expect((await h.client.listBackends()).map((b) => b.url)).toEqual([h.engine.url]);

    const session = h.client.openSession();
    await session.submit(mathTask('after-mismatch', 8, 9201));
    session.close();
    const out = await within(collect(session.trajectories()), 60_000, 'after-mismatch');
    expect(out).toHaveLength(8);
    for (const t of out) expect([TrajectoryStatus.TRAJECTORY_STATUS_COMPLETED, TrajectoryStatus.TRAJECTORY_STATUS_TRUNCATED], t.error).toContain(t.status);
  });

  it('vLLM: added when it serves the model named in the request', async () => {
    const backend = await h.client.addBackend({ url: other.url, id: 'other', model: 'other-model', maxConcurrency: 4 });
    expect(backend).toMatchObject({ id: 'other', maxModelLen: 1234 });
    await h.client.removeBackend('other');
  });

  it('SGLang: added, whatever its card is called (its /generate takes no model name)', async () => {
    const backend = await h.client.addBackend({ url: otherSglang.url, id: 'sglang', kind: BackendKind.BACKEND_KIND_SGLANG, maxConcurrency: 4 });
    expect(backend).toMatchObject({ id: 'sglang', maxModelLen: 40959 });
    await h.client.removeBackend('sglang');
  });
});

describe('a configured vLLM engine at start-up', () => {
  const start = (url: string) => startRolloutServer({ port: 0, model: 'policy', backends: [{ url }], tokenWorkers: { count: 0 } }, { logger: silentLogger(), sandboxes: new NullSandboxDriver() });

  it('serving another model stops the start, naming backends[0].model and what it serves', async () => {
    const err = await start(other.url).then(
      async (s) => {
        await s.shutdown();
        return expect.fail('the server started');
      },
      (e: unknown) => e as RolloutError,
    );
    expect(err).toBeInstanceOf(RolloutError);
    expect({ code: err.code, field: err.field }).toEqual({ code: 'invalid_argument', field: 'backends.0.model' });
    expect(err.message).toBe(`backends[0].model (${other.url}): vLLM ${other.url} does not serve model "policy" (GET /v1/models: it serves "other-model")`);
  });

  it('not up yet does not stop the start: the server serves, and learns the engine once it answers', async () => {
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const { port } = closed.address() as { port: number };
    await new Promise((resolve) => closed.close(resolve));
    const server = await start(`http://127.0.0.1:${port}`);
    try {
      expect(server.pool.list()).toMatchObject([{ id: `http://127.0.0.1:${port}`, maxModelLen: undefined }]);
    } finally {
      await server.shutdown();
    }
  });
});
