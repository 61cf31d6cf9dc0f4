import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BackendPool } from '../../src/backends/pool.js';
import { SglangClient } from '../../src/backends/sglang-client.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';

let tokenizer: Tokenizer;
let prompt: number[];
let vllm: FakeVllmEngine;
let sglang: FakeSglangEngine;

beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
  prompt = tokenizer.encode('<|im_start|>user\nWhat is 2 + 3 * 4?<|im_end|>\n<|im_start|>assistant\n');
  vllm = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 10 });
  sglang = await FakeSglangEngine.start({ tokenizer, tokenLatencyMs: 10 });
});

afterAll(async () => {
  await vllm?.close();
  await sglang?.close();
});

describe('a lease names each of its requests, so the trajectory\u2019s request in flight can be aborted on its engine', () => {
  const engines = [
    { kind: 'vllm', client: () => new VllmClient({ url: vllm.url, model: vllm.model }), engineIds: () => vllm.inflightRequestIds(), engineId: (id: string) => `cmpl-${id}-0` },
    { kind: 'sglang', client: () => new SglangClient({ url: sglang.url, model: 'm' }), engineIds: () => sglang.inflightRequestIds(), engineId: (id: string) => id },
  ] as const;

  for (const e of engines) {
    it(`${e.kind}: every generate carries a fresh id; aborting it ends the turn with finish "abort"`, async () => {
      const pool = new BackendPool();
      const client = e.client();
      pool.add(client, { id: e.kind, maxConcurrency: 4, model: 'm', maxModelLen: 40960 });
      const lease = await pool.acquire('task-1/0');
      try {
        expect(lease.inflightRequestId).toBeUndefined();
        const turn = lease.generate({ promptIds: prompt, maxTokens: 256, seed: 1, signal: new AbortController().signal });
        const id = lease.inflightRequestId!;
        expect(id).toMatch(/^[0-9a-f-]{36}-0$/);
        await expect.poll(() => e.engineIds()).toEqual([e.engineId(id)]);
        await client.abort([id], AbortSignal.timeout(2_000));
        expect((await turn).finishReason).toBe('abort');
        expect(lease.inflightRequestId).toBeUndefined();
        const next = lease.generate({ promptIds: prompt, maxTokens: 256, seed: 1, signal: new AbortController().signal });
        expect(lease.inflightRequestId).toBe(id.replace(/-0$/, '-1'));
        expect((await next).finishReason).toBe('stop');
      } finally {
        lease.release();
        pool.close();
      }
    });
  }
});
