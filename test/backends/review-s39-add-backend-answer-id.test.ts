import { status, type ServiceError } from '@grpc/grpc-js';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { BackendKind } from '../../gen/ts/rollout/v1/backend.js';
import { expectRolloutError } from '../support/engine-client-support.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

// A configured vLLM backend could opt in to `checkAnswerId` (an answer whose id is not cmpl-<its X-Request-Id> is refused
// as meant for another request), but AddBackend had no such field: an engine added at run time could never have its
// answers' ids checked. AddBackendRequest.check_answer_id now carries it, refused for other kinds naming the field as the
// config refuses it. Real server and gRPC client; the engine is the fake vLLM over real HTTP (a test double), which
// names its answers cmpl-fake-<n> — never the request's id — so with the check every answer is refused.

const signal = (): AbortSignal => new AbortController().signal;
let harness: ServerHarness | undefined;
let fake: FakeVllmEngine | undefined;
afterEach(async () => {
  await harness?.close();
  harness = undefined;
  await fake?.close();
  fake = undefined;
});

async function setUp(): Promise<{ h: ServerHarness; engine: FakeVllmEngine; prompt: number[] }> {
  const { tokenizer } = await loadQwen3();
  fake = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 0 });
  harness = await startServerHarness({ config: { backends: [] } });
  return { h: harness, engine: fake, prompt: tokenizer.encode('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n') };
}

describe('AddBackend check_answer_id', () => {
  it('reaches the engine client: the added vLLM\u2019s answers not named cmpl-<X-Request-Id> are refused', async () => {
    const { h, engine, prompt } = await setUp();
    await h.client.addBackend({ url: engine.url, id: 'checked', maxConcurrency: 4, model: engine.model, checkAnswerId: true });
    const lease = await h.server.runtime.deps.pool.acquire('t');
    expect(lease.backendId).toBe('checked');
    const err = await expectRolloutError(lease.generate({ promptIds: prompt, maxTokens: 8, signal: signal() }), 'backend_error');
    expect(err.message).toMatch(/backend checked misdelivered: .*id = "cmpl-fake-\d+", but the request's completion id \(cmpl-<X-Request-Id>\) is "cmpl-/);
    lease.release();
  });

  it('is off when not set: the same engine\u2019s answers are taken', async () => {
    const { h, engine, prompt } = await setUp();
    await h.client.addBackend({ url: engine.url, id: 'unchecked', maxConcurrency: 4, model: engine.model });
    const lease = await h.server.runtime.deps.pool.acquire('t');
    await expect(lease.generate({ promptIds: prompt, maxTokens: 8, signal: signal() })).resolves.toMatchObject({ backendId: 'unchecked' });
    lease.release();
  });

  it('is INVALID_ARGUMENT naming check_answer_id for a backend that is not vLLM, and nothing is added', async () => {
    const { h } = await setUp();
    const err = (await h.client
      .addBackend({ url: 'http://127.0.0.1:9', id: 'sg', kind: BackendKind.BACKEND_KIND_SGLANG, checkAnswerId: true })
      .then(() => expect.fail('expected INVALID_ARGUMENT'), (e: unknown) => e)) as ServiceError;
    expect(err.code).toBe(status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/check_answer_id: is for vllm backends \(an sglang engine's answers are always checked\)/);
    expect(h.server.pool.list().map((b) => b.id)).not.toContain('sg');
  });
});
