import { describe, expect, it } from 'vitest';
import { TrajectoryStatus } from '../../gen/ts/rollout/v1/rollout.js';
import { VllmClient } from '../../src/backends/vllm-client.js';
import type { Environment } from '../../src/environments/types.js';
import { RolloutError } from '../../src/errors.js';
import { runAgentLoop } from '../../src/pipeline/agent-loop.js';
import { stopAcrossBoundary } from '../../src/pipeline/continuation-stop.js';
import { Sample, type RunResult } from '../../src/pipeline/sample.js';
import type { ResolvedLimits, ResolvedSampling } from '../../src/pipeline/task.js';
import { buildFailedTrajectory } from '../../src/pipeline/trajectory.js';
import { FakeVllmEngine } from '../../src/testing/fake-vllm.js';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';
import type { BackendPool } from '../../src/backends/pool.js';
import { HermesToolCallParser } from '../../src/tools/hermes-parser.js';
import { CountingSandbox, fakeEnvironment, fakeTask } from '../support/pipeline-fixtures.js';
import { poolSuite } from '../support/pool-suite.js';

// One trajectory's turns against its engines, through runAgentLoop with a real pool and the Qwen3 tokenizer: how a
// turn continued after an abort ends, how its max_tokens fits the engine that serves it, and what a failed one reports.
// Engines: the in-memory double (the test decides each answer) or the fake vLLM over real HTTP.

const suite = poolSuite({ pool: { acquireTimeoutMs: 500 }, question: 'What is 6 * 7?' });

function makeSample(opts: { sampling?: Partial<ResolvedSampling>; limits?: Partial<ResolvedLimits>; environment?: Environment } = {}): Sample {
  const task = fakeTask('turns', opts.limits ?? {}, {
    sampling: { maxTokensPerTurn: 64, maxTotalTokens: 4096, stop: [], ...opts.sampling },
    environment: opts.environment ?? fakeEnvironment,
  });
  const sample = new Sample(task, 0, () => undefined);
  sample.sandbox = new CountingSandbox('s');
  sample.initialMessages = [{ role: 'user', content: 'What is 6 * 7? Answer in <answer></answer> tags.' }];
  return sample;
}

function runLoop(sample: Sample, pool: BackendPool, extra: { maxContinuationsPerTurn?: number } = {}): Promise<RunResult> {
  const { tokenizer } = suite;
  return import('../../src/tokens/tokenizer.js')
    .then(({ loadQwen3 }) => loadQwen3())
    .then(({ template }) => runAgentLoop(sample, { pool, tokenizer, template, parser: new HermesToolCallParser(), ...extra }, sample.signal));
}

const answer = (ids: number[], finishReason: 'stop' | 'length' | 'abort') => ({ tokenIds: ids, logprobs: ids.map(() => -0.1), finishReason, text: '' });

describe('stopAcrossBoundary', () => {
  const decode = (ids: readonly number[]): string => suite.tokenizer.decode(ids);
  const enc = (text: string): number[] => suite.tokenizer.encode(text);

  it('keeps the new segment up to the token completing a stop string begun before the boundary', () => {
    const earlier = enc('The product is <answer>42</ans');
    const segment = enc('wer> and then more words');
    const keep = stopAcrossBoundary(earlier, segment, ['</answer>'], decode);
    expect(keep).toBeDefined();
    expect(decode([...earlier, ...segment.slice(0, keep)])).toMatch(/<\/answer>$/u);
    expect(decode([...earlier, ...segment.slice(0, keep! - 1)])).not.toContain('</answer>');
  });

  it('finds nothing when no stop spans the boundary: one inside the new segment is the engine\u2019s own to see', () => {
    expect(stopAcrossBoundary(enc('<answer>42'), enc(' is it </answer> done'), ['</answer>'], decode)).toBeUndefined();
    expect(stopAcrossBoundary(enc('abc'), enc('def'), [], decode)).toBeUndefined();
    expect(stopAcrossBoundary([], enc('def'), ['x'], decode)).toBeUndefined();
  });

  it('takes the stop that completes first when several span the boundary, and a character split over the boundary', () => {
    const earlier = enc('result: STO');
    const segment = enc('P! and END');
    expect(decode([...earlier, ...segment.slice(0, stopAcrossBoundary(earlier, segment, ['STOP! and', 'STOP'], decode))])).toMatch(/STOP$/u);
    // "é" (2 bytes) split over the two segments' byte tokens.
    const bytes = [...enc('café')];
    for (let cut = 1; cut < bytes.length; cut++) {
      const keep = stopAcrossBoundary(bytes.slice(0, cut), [...bytes.slice(cut), ...enc(' more')], ['café'], decode);
      if (decode(bytes.slice(0, cut)).replace(/\uFFFD+$/u, '').length < 'café'.length) expect(keep).toBe(bytes.length - cut);
    }
  });
});

describe('a turn continued after an abort', () => {
  it('ends at a stop string the abort cut in two, as an uninterrupted turn would (answer, nothing after it)', async () => {
    const { tokenizer } = suite;
    const pool = suite.makePool();
    const engine = new InMemoryEngineClient();
    pool.add(engine, { id: 'a', model: 'm', maxConcurrency: 4, maxModelLen: 40960 });
    const sample = makeSample({ sampling: { stop: ['</answer>'], maxTokensPerTurn: 64 } });
    const run = runLoop(sample, pool);
    const first = tokenizer.encode('The product is <answer>42</ans');
    await expect.poll(() => engine.pending.length).toBe(1);
    engine.pending[0]!.resolve(answer(first, 'abort'));
    // The continuation: "wer>" alone is no match for the engine, which scans only what it generates.
    await expect.poll(() => engine.pending.length).toBe(1);
    const continuation = engine.pending[0]!;
    expect(continuation.request.stop).toEqual(['</answer>']);
    const ramble = tokenizer.encode('wer>' + ' and then some more words'.repeat(40)).slice(0, continuation.request.maxTokens);
    continuation.resolve(answer(ramble, 'length'));

    const result = await run;
    const content = result.outcome.messages.at(-1)!.content;
    expect({ finishReason: result.outcome.finishReason, truncated: result.truncated }).toEqual({ finishReason: 'answer', truncated: false });
    expect(content).toMatch(/<\/answer>$/u);
    // Every recorded token is a prefix of what the engine sampled, with its logprob; the turn's last span ends "stop".
    const spans = result.tokens.turns.filter((t) => t.role === 'assistant');
    expect(spans.map((s) => s.finishReason)).toEqual(['abort', 'stop']);
    const second = result.tokens.responseIds.slice(spans[1]!.start, spans[1]!.end);
    expect(second).toEqual(ramble.slice(0, second.length));
    expect(second.length).toBeLessThan(ramble.length);
  });

  it('counts one turn in a failed trajectory\u2019s num_turns, however many spans its continuations made', async () => {
    const pool = suite.makePool();
    const engine = new InMemoryEngineClient();
    pool.add(engine, { id: 'a', model: 'm', maxConcurrency: 4, maxModelLen: 40960 });
    const sample = makeSample();
    const run = runLoop(sample, pool, { maxContinuationsPerTurn: 2 }).catch((e: unknown) => e);
    for (let i = 0; i < 3; i++) {
      await expect.poll(() => engine.pending.length).toBe(1);
      engine.pending[0]!.resolve(answer([100 + i], 'abort'));
    }
    const err = await run;
    expect(err).toBeInstanceOf(RolloutError);
    const trajectory = buildFailedTrajectory(sample, err as RolloutError);
    expect(trajectory.status).toBe(TrajectoryStatus.TRAJECTORY_STATUS_BACKEND_ERROR);
    expect(trajectory.turns.filter((t) => t.continuesTurn).length).toBe(2);
    expect(trajectory.numTurns).toBe(1);
  });
});

describe('max_tokens against the serving engine\u2019s context', () => {
  it('a limit unknown when the turn was sized: the refusal teaches it and the turn is asked again with the room left', async () => {
    // vLLM refuses prompt + max_tokens > max_model_len; here its limit could not be learned when it was added.
    const engine = suite.track(await FakeVllmEngine.start({ tokenizer: suite.tokenizer, maxModelLen: 2048, listModels: false, devMode: false, policy: () => 'The answer is 42.' }));
    const pool = suite.makePool();
    pool.add(new VllmClient({ url: engine.url, model: engine.model }), { id: 'a', model: engine.model, maxConcurrency: 4 });
    await pool.learn('a');
    expect(pool.list()[0]!.maxModelLen).toBeUndefined();
    const result = await runLoop(makeSample({ sampling: { maxTokensPerTurn: 4096, maxTotalTokens: 16_384 } }), pool);
    expect(pool.list()[0]!.maxModelLen).toBe(2048);
    expect({ finishReason: result.outcome.finishReason, truncated: result.truncated }).toEqual({ finishReason: 'answer', truncated: false });
    expect(result.tokens.responseIds.length).toBeGreaterThan(0);
  });

  it('after a failover to an engine with a shorter context, the request asks at most its room, and a cut there is max_model_len', async () => {
    const { tokenizer } = suite;
    const pool = suite.makePool();
    const a = new InMemoryEngineClient({ url: 'memory://a' });
    const b = new InMemoryEngineClient({ url: 'memory://b' });
    pool.add(a, { id: 'a', model: 'm', maxConcurrency: 4, maxModelLen: 40960 });
    const sample = makeSample({ sampling: { maxTokensPerTurn: 1024, maxTotalTokens: 16_384 } });
    const run = runLoop(sample, pool);
    // Turn 0 on a calls an unknown tool (an error observation follows, then turn 1).
    const call = tokenizer.encode('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>');
    const imEnd = tokenizer.tokenId('<|im_end|>')!;
    await expect.poll(() => a.pending.length).toBe(1);
    a.pending[0]!.resolve(answer([...call, imEnd], 'stop'));
    await expect.poll(() => sample.ledger?.totalTokens ?? 0).toBeGreaterThan(call.length + 20);
    pool.add(b, { id: 'b', model: 'm', maxConcurrency: 4, maxModelLen: 300 });
    pool.setHealthy('a', false);
    await expect.poll(() => b.pending.length).toBe(1);
    const request = b.pending[0]!.request;
    expect(request.promptIds.length + request.maxTokens).toBe(300);
    const words = tokenizer.encode(' word'.repeat(request.maxTokens)).slice(0, request.maxTokens);
    b.pending[0]!.resolve(answer(words, 'length'));
    const result = await run;
    expect({ finishReason: result.outcome.finishReason, truncated: result.truncated }).toEqual({ finishReason: 'max_model_len', truncated: true });
  });

  it('a turn the engine cut short of max_tokens (finish length, fewer tokens: vLLM 0.3x shortens to its context) is max_model_len', async () => {
    const pool = suite.makePool();
    const engine = new InMemoryEngineClient();
    pool.add(engine, { id: 'a', model: 'm', maxConcurrency: 4 }); // its limit unknown
    const run = runLoop(makeSample({ sampling: { maxTokensPerTurn: 64 } }), pool);
    await expect.poll(() => engine.pending.length).toBe(1);
    expect(engine.pending[0]!.request.maxTokens).toBe(64);
    engine.pending[0]!.resolve(answer(suite.tokenizer.encode(' word'.repeat(10)), 'length'));
    const result = await run;
    expect({ finishReason: result.outcome.finishReason, truncated: result.truncated }).toEqual({ finishReason: 'max_model_len', truncated: true });
  });
});

