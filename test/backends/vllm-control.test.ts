import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import { FakeVllmEngine, type FakeVllmOptions } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';

let tokenizer: Tokenizer;
let prompt: number[];
const engines: FakeVllmEngine[] = [];

beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
  prompt = tokenizer.encode('<|im_start|>user\nWhat is 17 * 23 + 5?<|im_end|>\n<|im_start|>assistant\n');
});

afterEach(async () => {
  for (const e of engines.splice(0)) await e.close();
});

async function slowEngine(options: Partial<FakeVllmOptions> = {}): Promise<{ engine: FakeVllmEngine; client: VllmClient }> {
  const engine = await FakeVllmEngine.start({ tokenizer, tokenLatencyMs: 10, ...options });
  engines.push(engine);
  return { engine, client: new VllmClient({ url: engine.url, model: engine.model }) };
}

const signal = (): AbortSignal => new AbortController().signal;
const ask = (client: VllmClient, requestId?: string, seed = 3) =>
  client.generate({ promptIds: prompt, maxTokens: 256, seed, signal: signal(), ...(requestId !== undefined && { requestId }) });

describe('VllmClient control operations (VLLM_SERVER_DEV_MODE endpoints) against the fake vLLM', () => {
  it('sends the request id as request_id and X-Request-Id; vLLM names the engine request cmpl-<id>-0', async () => {
    const { engine, client } = await slowEngine({ tokenLatencyMs: 0 });
    await ask(client, 'traj-9-2');
    expect(engine.lastRequest).toMatchObject({ request_id: 'traj-9-2' });
    expect(engine.lastRequestId).toBe('cmpl-traj-9-2-0');
  });

  it('POST /abort_requests aborts one request by id: finish "abort" with the prefix decoded so far; the other completes', async () => {
    const { engine, client } = await slowEngine();
    const victim = ask(client, 'victim');
    const other = ask(client, 'other');
    await expect.poll(() => engine.inflightRequestIds().sort()).toEqual(['cmpl-other-0', 'cmpl-victim-0']);
    await new Promise((resolve) => setTimeout(resolve, 50));
    await client.abort(['victim'], signal());
    const aborted = await victim;
    const full = await other;
    expect(aborted.finishReason).toBe('abort');
    expect(aborted.tokenIds.length).toBeGreaterThan(0);
    expect(aborted.tokenIds.length).toBeLessThan(full.tokenIds.length);
    expect(full.tokenIds.slice(0, aborted.tokenIds.length)).toEqual(aborted.tokenIds);
    expect(full.finishReason).toBe('stop');
    expect(engine.stats().aborted).toBe(1);
  });

  it('abort without ids aborts everything in flight', async () => {
    const { engine, client } = await slowEngine();
    const all = [ask(client, 'a'), ask(client, 'b'), ask(client)];
    await expect.poll(() => engine.inflightRequestIds().length).toBe(3);
    await client.abort(undefined, signal());
    expect((await Promise.all(all)).map((r) => r.finishReason)).toEqual(['abort', 'abort', 'abort']);
  });

  it('pause?mode=abort aborts what runs; requests sent while paused wait for /resume', async () => {
    const { engine, client } = await slowEngine();
    const running = ask(client, 'r');
    await expect.poll(() => engine.inflightRequestIds()).toEqual(['cmpl-r-0']);
    await client.pause('abort', signal());
    expect((await running).finishReason).toBe('abort');
    let settled = false;
    const waiting = ask(client, 'w').finally(() => (settled = true));
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(settled).toBe(false);
    await client.resume(signal());
    expect((await waiting).finishReason).toBe('stop');
  });

  it('pause?mode=wait returns only once the requests in flight have finished, unaborted', async () => {
    const { engine, client } = await slowEngine({ tokenLatencyMs: 3 });
    const running = ask(client, 'r');
    await expect.poll(() => engine.inflightRequestIds()).toEqual(['cmpl-r-0']);
    await client.pause('wait', signal());
    expect(engine.inflightRequestIds()).toEqual([]);
    expect((await running).finishReason).toBe('stop');
    await client.resume(signal());
  });

  it('pause?mode=keep freezes a request (no progress while paused) and /resume continues it to the same answer', async () => {
    const { engine, client } = await slowEngine({ tokenLatencyMs: 5 });
    const reference = await (await slowEngine({ tokenLatencyMs: 0 })).client.generate({ promptIds: prompt, maxTokens: 256, seed: 8, signal: signal() });
    const running = ask(client, 'k', 8);
    await expect.poll(() => engine.inflightRequestIds()).toEqual(['cmpl-k-0']);
    await client.pause('keep', signal());
    let settled = false;
    void running.finally(() => (settled = true));
    await new Promise((resolve) => setTimeout(resolve, 5 * reference.tokenIds.length + 100));
    expect(settled).toBe(false);
    await client.resume(signal());
    expect(await running).toEqual(reference);
  });

  it('a vLLM without VLLM_SERVER_DEV_MODE answers 404: the control call fails with backend_error', async () => {
    const { client } = await slowEngine({ devMode: false });
    const err = await client.pause('abort', signal()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RolloutError);
    expect((err as RolloutError).code).toBe('backend_error');
    expect((err as RolloutError).message).toContain('answered HTTP 404 to POST /pause?mode=abort');
  });
});
