import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { TaskInput } from '../../src/client/rollout-client.js';
import { parseConfig } from '../../src/config.js';
import { FakeSglangEngine } from '../../src/testing/fake-sglang.js';
import { createScriptedMathPolicy } from '../../src/testing/scripted-policy.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { Tokenizer } from '../../src/tokens/types.js';
import { BackendKind } from '../../gen/ts/rollout/v1/backend.js';
import { Role, TrajectoryStatus, type Trajectory } from '../../gen/ts/rollout/v1/rollout.js';
import { collect, invariantViolations, mathTask } from '../support/harness.js';
import { startServerHarness, type ServerHarness, type ServerHarnessOptions } from '../support/server-harness.js';

/** A policy that always calls the python tool, then answers right: every sample is COMPLETED with reward 1. */
const policy = createScriptedMathPolicy({ wrongAnswerRate: 0, malformedToolCallRate: 0 });

let tokenizer: Tokenizer;
const sampled: Array<{ tokenIds: readonly number[]; logprobs: readonly number[] }> = [];
const cleanups: Array<() => Promise<void>> = [];

beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
});

afterEach(async () => {
  for (const close of cleanups.splice(0).reverse()) await close();
  sampled.length = 0;
});

async function sglang(options: { contextLength?: number; tokenLatencyMs?: number } = {}): Promise<FakeSglangEngine> {
  const engine = await FakeSglangEngine.start({ tokenizer, model: 'fake-qwen3', policy, onCompletion: (c) => void sampled.push(c), ...options });
  cleanups.push(() => engine.close());
  return engine;
}

async function harness(options: ServerHarnessOptions): Promise<ServerHarness> {
  const h = await startServerHarness({ ...options, engine: { policy, onCompletion: (c) => void sampled.push(c), ...options.engine } });
  cleanups.push(() => h.close());
  return h;
}

async function run(h: ServerHarness, task: TaskInput): Promise<Trajectory[]> {
  const session = h.client.openSession();
  await session.submit(task);
  session.close();
  return collect(session.trajectories());
}

const name = (t: Trajectory): string => `${t.taskId}#${t.sampleIndex} ${TrajectoryStatus[t.status]} ${t.finishReason} ${t.error}`;

/** Every assistant turn is exactly one engine answer: its ids and logprobs, verbatim (logprobs travel as float32). */
function expectSampledVerbatim(t: Trajectory): void {
  const key = (ids: readonly number[], logprobs: readonly number[]): string => `${ids.join(',')}|${logprobs.map(Math.fround).join(',')}`;
  const answers = new Set(sampled.map((s) => key(s.tokenIds, s.logprobs)));
  for (const turn of t.turns.filter((x) => x.role === Role.ROLE_ASSISTANT)) {
    const turnKey = key(t.responseTokenIds.slice(turn.start, turn.end), t.responseLogprobs.slice(turn.start, turn.end));
    expect(answers.has(turnKey), `${name(t)}: assistant turn ${turn.start}-${turn.end} is not an engine answer`).toBe(true);
  }
}

function expectSolvedWithTool(t: Trajectory, backend: string): void {
  expect(TrajectoryStatus[t.status], name(t)).toBe('TRAJECTORY_STATUS_COMPLETED');
  expect(t.reward).toBe(1);
  expect(invariantViolations(t)).toEqual([]);
  expect(t.turns.some((turn) => turn.toolName === 'python'), name(t)).toBe(true);
  expect(new Set(t.turns.filter((turn) => turn.role === Role.ROLE_ASSISTANT).map((turn) => turn.backend))).toEqual(new Set([backend]));
  expectSampledVerbatim(t);
}

describe('an SGLang engine serves the rollout server end to end', () => {
  it('config backends [{kind: "sglang", url}]: a math group calls the python tool and is solved, every token as SGLang sampled it', async () => {
    const engine = await sglang({ contextLength: 32768 });
    const h = await harness({ config: { backends: [{ kind: 'sglang', url: engine.url, id: 'sglang-0', maxConcurrency: 16 }] } });
    const listed = await h.client.listBackends();
    expect(listed).toEqual([expect.objectContaining({ id: 'sglang-0', kind: BackendKind.BACKEND_KIND_SGLANG, healthy: true, maxModelLen: 32767 })]);
    const group = await run(h, mathTask('sglang-config', 4, 2101));
    expect(group).toHaveLength(4);
    for (const t of group) expectSolvedWithTool(t, 'sglang-0');
    expect(engine.stats().served).toBeGreaterThanOrEqual(8);
    expect(h.engine.stats().received).toBe(0);
  });

  it('AddBackend {kind: BACKEND_KIND_SGLANG}: the added engine serves the next tasks', async () => {
    const engine = await sglang();
    const h = await harness({ config: { backends: [] } });
    const added = await h.client.addBackend({ url: engine.url, kind: BackendKind.BACKEND_KIND_SGLANG, id: 'sg', maxConcurrency: 8 });
    expect(added).toMatchObject({ id: 'sg', kind: BackendKind.BACKEND_KIND_SGLANG, maxModelLen: 40959 });
    const [t] = await run(h, mathTask('sglang-added', 1, 2102));
    expectSolvedWithTool(t!, 'sg');
  });

  it('a mixed pool (one vLLM fake, one SGLang fake): both engines serve trajectories of one group', async () => {
    const engine = await sglang({ tokenLatencyMs: 2 });
    const h = await harness({ engine: { tokenLatencyMs: 2 } });
    await h.client.addBackend({ url: engine.url, kind: BackendKind.BACKEND_KIND_SGLANG, id: 'sg', maxConcurrency: 64 });
    const vllmId = (await h.client.listBackends()).find((b) => b.kind === BackendKind.BACKEND_KIND_VLLM)!.id;
    const group = await run(h, mathTask('mixed', 8, 2103));
    expect(group).toHaveLength(8);
    const served = new Set<string>();
    for (const t of group) {
      const backend = t.turns.find((turn) => turn.role === Role.ROLE_ASSISTANT)!.backend;
      served.add(backend);
      expectSolvedWithTool(t, backend);
    }
    expect(served).toEqual(new Set([vllmId, 'sg']));
    expect(engine.stats().served).toBeGreaterThan(0);
    expect(h.engine.stats().served).toBeGreaterThan(0);
  });
});

describe('the kinds are enumerated once', () => {
  it('config accepts every kind of the table and names them when refusing another', () => {
    expect(parseConfig({ backends: [{ kind: 'sglang', url: 'http://127.0.0.1:30000' }] }).backends[0]!.kind).toBe('sglang');
    expect(() => parseConfig({ backends: [{ kind: 'tgi', url: 'http://127.0.0.1:30000' }] })).toThrow(/vllm.*sglang.*embedded/);
  });
});
