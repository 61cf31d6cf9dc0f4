/**
 * Benchmark child: the fake vLLM engine (src/testing/fake-vllm.ts, a TEST DOUBLE speaking vLLM's HTTP API) in its
 * own process at zero token latency (or after a service time per request, `setServiceMs`), driven by
 * bench/orchestration.ts over IPC (see child-rpc.ts). It can
 * record the completion requests it receives (to replay them straight at the engine, without the server) and
 * hold second-turn requests unanswered (to keep trajectories in flight for the memory measurement).
 */
import { FakeVllmEngine } from '../src/testing/fake-vllm.js';
import { hashInts } from '../src/testing/arithmetic.js';
import { calcPolicy } from '../src/testing/calc-environment.js';
import { longContextPolicy } from '../src/testing/long-context-environment.js';
import { scriptedMathPolicy, type FakePolicy } from '../src/testing/scripted-policy.js';
import { loadQwen3 } from '../src/tokens/tokenizer.js';
import { serveChild } from './child-rpc.js';

/** The sampling fields of one completion request, as the server sent them. */
export interface RecordedRequest {
  prompt: number[];
  max_tokens: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  seed?: number;
  stop?: string[];
  /** The prompt already holds a tool response: an environment turn came before this request. */
  laterTurn: boolean;
}

export type EngineMode = 'calc' | 'math' | 'long';

export interface EngineStats {
  received: number;
  served: number;
  failed: number;
  inflight: number;
  maxInflight: number;
  /** Requests left unanswered by `hold`. */
  held: number;
  cpu: NodeJS.CpuUsage;
  memory: NodeJS.MemoryUsage;
}

export type EngineApi = {
  setMode: (mode: EngineMode) => void;
  /**
   * Every completion is answered a service time after it arrives: on average `ms` (0: at once, the default), spread
   * uniformly over 0.5-1.5 × `ms` by a hash of the request's seed and prompt length, so requests do not finish in
   * lockstep and a request replayed directly takes as long as it did through the server. Timers only: the wait
   * costs the engine child no CPU, as a GPU's decoding costs the host little — so with `ms` > 0 the engine, not
   * these cores, bounds throughput (bench/orchestration's engine-bound passes).
   */
  setServiceMs: (ms: number) => void;
  record: (on: boolean) => void;
  takeRecorded: () => RecordedRequest[];
  /** While on, every request whose prompt already holds a tool response (turn 2 and later) gets no answer. */
  hold: (on: boolean) => void;
  stats: () => EngineStats;
  shutdown: () => Promise<void>;
};

export interface EngineInfo {
  url: string;
  model: string;
}

const POLICIES: Record<EngineMode, FakePolicy> = { calc: calcPolicy, math: scriptedMathPolicy, long: longContextPolicy };

async function main(): Promise<void> {
  const { tokenizer } = await loadQwen3();
  let mode: EngineMode = 'calc';
  let serviceMs = 0;
  let recording = false;
  let recorded: RecordedRequest[] = [];
  let holding = false;
  let held = 0;
  const toolResponseId = tokenizer.tokenId('<tool_response>');
  const isLaterTurn = (prompt: unknown): boolean =>
    Array.isArray(prompt) && (toolResponseId !== undefined ? prompt.includes(toolResponseId) : tokenizer.decode(prompt as number[]).includes('<tool_response>'));

  const engine = await FakeVllmEngine.start({
    tokenizer,
    tokenLatencyMs: 0,
    requestLatencyMs: ({ body }) => (serviceMs === 0 ? 0 : serviceMs * (0.5 + serviceSpread(body))),
    // Room for the long-context pass (~64K-token conversations).
    maxModelLen: 131_072,
    policy: (prompt, ctx) => POLICIES[mode](prompt, ctx),
    inject: ({ body }) => {
      if (recording) recorded.push({ ...pick(body), laterTurn: isLaterTurn(body.prompt) });
      if (holding && isLaterTurn(body.prompt)) {
        held++;
        return { kind: 'hang' };
      }
      return undefined;
    },
  });

  const api: EngineApi = {
    setMode: (m) => void (mode = m),
    setServiceMs: (ms) => void (serviceMs = ms),
    record: (on) => void (recording = on),
    takeRecorded: () => {
      const out = recorded;
      recorded = [];
      return out;
    },
    hold: (on) => {
      holding = on;
      if (!on) held = 0;
    },
    stats: () => {
      const s = engine.stats();
      return { received: s.received, served: s.served, failed: s.failed, inflight: s.inflight, maxInflight: s.maxInflight, held, cpu: process.cpuUsage(), memory: process.memoryUsage() };
    },
    shutdown: async () => {
      await engine.close();
      setImmediate(() => process.exit(0));
    },
  };
  await serveChild<EngineInfo>(Promise.resolve({ url: engine.url, model: engine.model }), api);
}

/** A uniform [0, 1) fixed by the request's seed and prompt length (the same request, the same draw). */
function serviceSpread(body: Record<string, unknown>): number {
  const seed = typeof body.seed === 'number' ? body.seed : 0;
  const length = Array.isArray(body.prompt) ? body.prompt.length : 0;
  return hashInts(seed, length, 0x5e7) / 2 ** 32;
}

function pick(body: Record<string, unknown>): Omit<RecordedRequest, 'laterTurn'> {
  const out: Omit<RecordedRequest, 'laterTurn'> = { prompt: body.prompt as number[], max_tokens: body.max_tokens as number };
  if (typeof body.temperature === 'number') out.temperature = body.temperature;
  if (typeof body.top_p === 'number') out.top_p = body.top_p;
  if (typeof body.top_k === 'number') out.top_k = body.top_k;
  if (typeof body.seed === 'number') out.seed = body.seed;
  if (Array.isArray(body.stop)) out.stop = body.stop as string[];
  return out;
}

void main().catch((err: unknown) => {
  console.error('engine child failed:', err);
  process.exit(1);
});
