import { afterEach, describe, expect, it } from 'vitest';
import { PauseMode } from '../../gen/ts/rollout/v1/backend.js';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { parseContextOverflow, parseSglangContextOverflow } from '../../src/backends/context-overflow.js';
import { parseSglangServerInfo, parseSglangTokenPool, parseVllmServerInfo } from '../../src/backends/server-info.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { collect, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness } from '../support/server-harness.js';

/**
 * An engine's limits reach ListBackends (and PauseGeneration's answer) as int32 fields (max_model_len,
 * max_concurrency). An engine stating one past int32 — no real engine has a 2^31-token context or runs 2^31
 * sequences — must not be taken as said: encoding it fails those calls for every backend, not just its own. It is
 * read as 2^31 - 1 (no limit the server can reach either way).
 */
const INT32_MAX = 2 ** 31 - 1;
let h: ServerHarness | undefined;
const engines: FakeVllmEngine[] = [];
afterEach(async () => {
  await h?.close();
  h = undefined;
  for (const e of engines.splice(0)) await e.close();
});

describe('an engine stating limits past int32', () => {
  it('a /v1/models max_model_len of 2^31 is read as 2^31 - 1: ListBackends keeps answering and trajectories complete', async () => {
    h = await startServerHarness({ engine: { maxModelLen: 2 ** 31 } });
    const backends = await h.client.listBackends();
    expect(backends).toHaveLength(1);
    expect(backends[0]!.maxModelLen).toBe(INT32_MAX);
    const session = h.client.openSession();
    await session.submit(mathTask('absurd-max-model-len', 1, 6601));
    session.close();
    const [t] = await collect(session.trajectories());
    expect(TrajectoryStatus[t!.status]).toBe('TRAJECTORY_STATUS_COMPLETED');
  });

  it('a dev-mode max_num_seqs of 2^31 is read as 2^31 - 1: AddBackend and ListBackends keep answering', async () => {
    h = await startServerHarness();
    const { tokenizer } = await loadQwen3();
    const absurd = await FakeVllmEngine.start({ tokenizer, model: h.engine.model, devMode: true, maxNumSeqs: 2 ** 31 });
    engines.push(absurd);
    await h.client.addBackend({ url: absurd.url, id: 'absurd' });
    const backends = await h.client.listBackends();
    expect(backends.map((b) => b.id).sort()).toContain('absurd');
    const added = backends.find((b) => b.id === 'absurd')!;
    expect(added.maxConcurrency).toBe(INT32_MAX);
    // And a weight sync's pause, whose answer lists the backends, is not broken by it.
    expect((await h.client.pauseGeneration(PauseMode.PAUSE_MODE_ABORT, { backendId: 'absurd' })).map((b) => b.id)).toContain('absurd');
    await h.client.resumeGeneration({ backendId: 'absurd' });
  });
});

describe('the parsers of what engines say read no limit past int32', () => {
  it('server info: capacities (one rank, ranks multiplied or summed) and token pools', () => {
    const vllm = (seqs: number, dp: number): unknown => ({ vllm_config: { scheduler_config: { max_num_seqs: seqs }, parallel_config: { data_parallel_size: dp } } });
    expect(parseVllmServerInfo(vllm(256, 4)).maxConcurrency).toBe(1024);
    expect(parseVllmServerInfo(vllm(2 ** 31, 1)).maxConcurrency).toBe(INT32_MAX);
    expect(parseVllmServerInfo(vllm(2 ** 20, 2 ** 12)).maxConcurrency).toBe(INT32_MAX);
    const sglang = (...caps: number[]): unknown => ({ internal_states: caps.map((c) => ({ effective_max_running_requests_per_dp: c })) });
    expect(parseSglangServerInfo(sglang(128, 128)).maxConcurrency).toBe(256);
    expect(parseSglangServerInfo(sglang(2 ** 30, 2 ** 30)).maxConcurrency).toBe(INT32_MAX);
    expect(parseSglangServerInfo({ max_running_requests: 2 ** 40 }).maxConcurrency).toBe(INT32_MAX);
    expect(parseSglangTokenPool({ max_total_num_tokens: 2 ** 40 })).toBe(INT32_MAX);
  });

  it('context-length refusals stating such a limit are not taken as one (plain backend_error)', () => {
    const vllm = (n: number): string => JSON.stringify({ error: { message: `This model's maximum context length is ${n} tokens. However, you requested ${n + 10} tokens (${n} in the messages, 10 in the completion).` } });
    expect(parseContextOverflow(400, vllm(4096))?.maxModelLen).toBe(4096);
    expect(parseContextOverflow(400, vllm(2 ** 31))).toBeUndefined();
    const sglang = (n: number): string => JSON.stringify({ error: { message: `The input (${n + 1} tokens) is longer than the model's context length (${n} tokens).` } });
    expect(parseSglangContextOverflow(400, sglang(4096))?.maxModelLen).toBe(4095);
    expect(parseSglangContextOverflow(400, sglang(2 ** 32))).toBeUndefined();
  });
});
