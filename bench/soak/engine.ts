/**
 * The soak's engine process: the fake vLLM engine (src/testing/fake-vllm.ts, a TEST DOUBLE speaking vLLM's HTTP
 * API) answering both soak environments — the calc policy for `soak-calc` prompts, the scripted python policy for
 * `math` — with a long-tailed latency per request (see {@link requestLatencyMs}). Driven over IPC (child-rpc.ts);
 * exits with the bench.
 */
import { FakeVllmEngine, type FakeVllmStats } from '../../src/testing/fake-vllm.js';
import { calcPolicy } from '../../src/testing/calc-environment.js';
import { scriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { hashInts, seededRandom } from '../../src/testing/arithmetic.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { serveChild } from '../child-rpc.js';

export type SoakEngineApi = {
  stats: () => FakeVllmStats & { memory: NodeJS.MemoryUsage };
  shutdown: () => Promise<void>;
};

export interface SoakEngineInfo {
  url: string;
  model: string;
}

/** Engine latency bounds of one completion, ms. */
export const LATENCY_MIN_MS = 20;
export const LATENCY_MAX_MS = 200;

/**
 * Decode time of one completion: log-normal (median 45 ms, σ 0.6: p90 ≈ 97 ms, p99 ≈ 180 ms) clamped to
 * [20, 200] ms, drawn from the request's index so a run is repeatable. A real engine's latency is long-tailed
 * (batching, preemption); a constant one would hide queueing effects.
 */
export function requestLatencyMs(index: number): number {
  const random = seededRandom(hashInts(index, 0x50a6));
  // Box-Muller from two uniforms.
  const u = Math.max(random(), 1e-12);
  const normal = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * random());
  return Math.min(LATENCY_MAX_MS, Math.max(LATENCY_MIN_MS, 45 * Math.exp(0.6 * normal)));
}

async function main(): Promise<void> {
  const { tokenizer } = await loadQwen3();
  const engine = await FakeVllmEngine.start({
    tokenizer,
    // The python policy for math, the calc policy for the calc double (its system prompt names the calc tool).
    policy: (prompt, ctx) => (prompt.includes('call the `calc` tool') ? calcPolicy(prompt, ctx) : scriptedMathPolicy(prompt, ctx)),
    requestLatencyMs: ({ index }) => requestLatencyMs(index),
    // Far above what the soak keeps in flight: the fake never queues; latency is the distribution above.
    maxNumSeqs: 4096,
  });
  const api: SoakEngineApi = {
    stats: () => ({ ...engine.stats(), memory: process.memoryUsage() }),
    shutdown: async () => {
      await engine.close();
      setImmediate(() => process.exit(0));
    },
  };
  await serveChild<SoakEngineInfo>(Promise.resolve({ url: engine.url, model: engine.model }), api);
}

void main().catch((err: unknown) => {
  console.error('soak engine failed:', err);
  process.exit(1);
});
