import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { logprobsMismatch } from '../../src/backends/logprobs-mode.js';
import { parseSglangServerInfo, parseVllmServerInfo } from '../../src/backends/server-info.js';

/**
 * A real vLLM 0.32's GET /server_info?config_format=json (the tiny Qwen3 on CPU, started by src/testing/vllm-server.ts
 * with --logprobs-mode processed_logprobs), recorded with its `vllm_config` whole; `vllm_env` and `system_env` were
 * cut to nothing of interest and the checkout path replaced by /repo.
 */
const recorded = JSON.parse(readFileSync(new URL('../fixtures/vllm-0.32-server-info.json', import.meta.url), 'utf8')) as {
  vllm_config: { model_config: Record<string, unknown>; scheduler_config: Record<string, unknown>; parallel_config: Record<string, unknown> };
};

/** The recorded answer with parts of its config replaced. */
function vllmWith(patch: { model?: Record<string, unknown>; scheduler?: Record<string, unknown>; parallel?: Record<string, unknown> }): unknown {
  const c = recorded.vllm_config;
  return {
    ...recorded,
    vllm_config: {
      ...c,
      model_config: { ...c.model_config, ...patch.model },
      scheduler_config: { ...c.scheduler_config, ...patch.scheduler },
      parallel_config: { ...c.parallel_config, ...patch.parallel },
    },
  };
}

describe("vLLM's /server_info", () => {
  it('gives the logprobs mode and max_num_seqs of the recorded real answer', () => {
    expect(parseVllmServerInfo(recorded)).toEqual({ logprobsMode: 'processed', maxConcurrency: 128 });
  });

  it('maps raw_logprobs to raw and refuses the logits modes by name', () => {
    expect(parseVllmServerInfo(vllmWith({ model: { logprobs_mode: 'raw_logprobs' } }))).toMatchObject({ logprobsMode: 'raw' });
    for (const mode of ['raw_logits', 'processed_logits']) {
      const info = parseVllmServerInfo(vllmWith({ model: { logprobs_mode: mode } }));
      expect(info.logprobsMode).toBeUndefined();
      expect(info.unsupportedLogprobsMode).toBe(mode);
    }
  });

  it('counts the data-parallel ranks behind the API server: all (internal LB), the local ones (hybrid), one (external LB)', () => {
    const dp = { data_parallel_size: 4, data_parallel_size_local: 2 };
    expect(parseVllmServerInfo(vllmWith({ scheduler: { max_num_seqs: 64 }, parallel: dp })).maxConcurrency).toBe(256);
    expect(parseVllmServerInfo(vllmWith({ scheduler: { max_num_seqs: 64 }, parallel: { ...dp, data_parallel_hybrid_lb: true } })).maxConcurrency).toBe(128);
    expect(parseVllmServerInfo(vllmWith({ scheduler: { max_num_seqs: 64 }, parallel: { ...dp, data_parallel_external_lb: true } })).maxConcurrency).toBe(64);
  });

  it('says nothing it cannot read: the text format, absent or malformed fields', () => {
    expect(parseVllmServerInfo({ vllm_config: "model='x', seed=0" })).toEqual({ note: expect.stringContaining('vllm_config') as unknown });
    expect(parseVllmServerInfo(vllmWith({ model: { logprobs_mode: 'sideways' }, scheduler: { max_num_seqs: -1 } }))).toEqual({});
    expect(parseVllmServerInfo(null)).toMatchObject({ note: expect.any(String) as unknown });
  });
});

describe("SGLang's /get_server_info", () => {
  const state = (n: unknown) => ({ last_gen_throughput: 0, memory_usage: { token_capacity: 20480 }, effective_max_running_requests_per_dp: n });

  it("sums the ranks' effective running-request caps and never states a logprobs mode", () => {
    expect(parseSglangServerInfo({ dp_size: 1, max_running_requests: null, internal_states: [state(128)] })).toEqual({ maxConcurrency: 128 });
    expect(parseSglangServerInfo({ dp_size: 2, max_running_requests: 96, internal_states: [state(48), state(48)] })).toEqual({ maxConcurrency: 96 });
  });

  it('falls back to the --max-running-requests argument, else says nothing', () => {
    expect(parseSglangServerInfo({ max_running_requests: 64, internal_states: [] })).toEqual({ maxConcurrency: 64 });
    expect(parseSglangServerInfo({ max_running_requests: 64, internal_states: [state(null)] })).toEqual({ maxConcurrency: 64 });
    expect(parseSglangServerInfo({ max_running_requests: null })).toEqual({ note: expect.any(String) as unknown });
    expect(parseSglangServerInfo('nope')).toEqual({ note: expect.any(String) as unknown });
  });
});

describe('logprobsMismatch', () => {
  it('flags raw logprobs when temperature is not 1 or top-p/top-k cut, never at temperature 1 without cuts', () => {
    expect(logprobsMismatch('vllm', 'raw', {})).toBeUndefined();
    expect(logprobsMismatch('vllm', 'raw', { temperature: 1, topP: 1, topK: -1 })).toBeUndefined();
    expect(logprobsMismatch('vllm', 'raw', { temperature: 0.7 })).toMatch(/raw logprobs.*temperature 0.7/);
    expect(logprobsMismatch('vllm', 'raw', { topP: 0.9 })).toMatch(/top_p 0.9/);
    expect(logprobsMismatch('vllm', 'raw', { topK: 20 })).toMatch(/top_k 20/);
  });

  it("flags SGLang's processed logprobs only when top-p/top-k cut, vLLM's and the embedded engine's never, unknown never", () => {
    expect(logprobsMismatch('sglang', 'processed', { temperature: 0.6 })).toBeUndefined();
    expect(logprobsMismatch('sglang', 'processed', { topP: 0.95 })).toMatch(/SGLang/);
    expect(logprobsMismatch('vllm', 'processed', { temperature: 0.6, topP: 0.9, topK: 5 })).toBeUndefined();
    expect(logprobsMismatch('embedded', 'processed', { temperature: 0.6, topP: 0.9, topK: 5 })).toBeUndefined();
    expect(logprobsMismatch('vllm', undefined, { temperature: 0.6 })).toBeUndefined();
  });
});
