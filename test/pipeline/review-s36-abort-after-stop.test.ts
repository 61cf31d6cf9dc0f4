import { describe, expect, it } from 'vitest';
import { runAgentLoop } from '../../src/pipeline/agent-loop.js';
import { Sample, type RunResult } from '../../src/pipeline/sample.js';
import type { ResolvedSampling } from '../../src/pipeline/task.js';
import type { BackendPool } from '../../src/backends/pool.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import { InMemoryEngineClient } from '../../src/testing/in-memory-engine.js';
import { HermesToolCallParser } from '../../src/tools/hermes-parser.js';
import { CountingSandbox, fakeEnvironment, fakeTask } from '../support/pipeline-fixtures.js';
import { poolSuite } from '../support/pool-suite.js';

// Review s36, item 1: an engine answer "abort" (PauseGeneration ABORT during a weight update) whose tokens already end
// the turn — a stop token sampled last, or a stop string completed — must end the turn there, as the uninterrupted
// request would have (finish "stop"), not be continued after resume past the end of the turn.

const suite = poolSuite({ pool: { acquireTimeoutMs: 500 }, question: 'What is 6 * 7?' });

function makeSample(sampling: Partial<ResolvedSampling> = {}): Sample {
  const task = fakeTask('abort-after-stop', {}, {
    sampling: { maxTokensPerTurn: 64, maxTotalTokens: 4096, stop: [], ...sampling },
    environment: fakeEnvironment,
  });
  const sample = new Sample(task, 0, () => undefined);
  sample.sandbox = new CountingSandbox('s');
  sample.initialMessages = [{ role: 'user', content: 'What is 6 * 7? Answer in <answer></answer> tags.' }];
  return sample;
}

async function runLoop(sample: Sample, pool: BackendPool): Promise<RunResult> {
  const { template } = await loadQwen3();
  return runAgentLoop(sample, { pool, tokenizer: suite.tokenizer, template, parser: new HermesToolCallParser() }, sample.signal);
}

const answer = (ids: number[], finishReason: 'stop' | 'length' | 'abort') => ({ tokenIds: ids, logprobs: ids.map(() => -0.1), finishReason, text: '' });

/** Answers the first request with `ids` (finish "abort"); any later request (a continuation) with `ramble`. */
async function abortedWith(ids: number[], sampling: Partial<ResolvedSampling> = {}): Promise<{ result: RunResult; engine: InMemoryEngineClient }> {
  const pool = suite.makePool();
  const engine: InMemoryEngineClient = new InMemoryEngineClient({
    respond: (request) => {
      if (request === engine.calls[0]) return answer(ids, 'abort');
      // A continuation: the model samples on past the end of its turn (a new turn's worth of text).
      const ramble = suite.tokenizer.encode('\n<|im_start|>user\nmore<|im_end|>' + ' and more'.repeat(40)).slice(0, request.maxTokens);
      return answer(ramble, 'length');
    },
  });
  pool.add(engine, { id: 'a', model: 'm', maxConcurrency: 4, maxModelLen: 40960 });
  const result = await runLoop(makeSample(sampling), pool);
  return { result, engine };
}

describe('review s36: a request aborted after its turn had ended', () => {
  it('ends the turn at a stop token sampled last (<|im_end|>): no continuation, finish stop, the answer as sampled', async () => {
    const imEnd = suite.tokenizer.tokenId('<|im_end|>')!;
    const ids = [...suite.tokenizer.encode('The product is <answer>42</answer>'), imEnd];
    const { result, engine } = await abortedWith(ids);
    expect(engine.calls.length).toBe(1);
    expect({ finishReason: result.outcome.finishReason, truncated: result.truncated }).toEqual({ finishReason: 'answer', truncated: false });
    expect(result.tokens.responseIds).toEqual(ids);
    expect(result.tokens.turns.map((t) => [t.role, t.finishReason])).toEqual([['assistant', 'stop']]);
    expect(result.outcome.messages.at(-1)!.content).toBe('The product is <answer>42</answer>');
  });

  it('ends the turn at the first stop token of an aborted segment, dropping what an engine returned after it', async () => {
    const imEnd = suite.tokenizer.tokenId('<|im_end|>')!;
    const before = suite.tokenizer.encode('The product is 42.');
    const { result, engine } = await abortedWith([...before, imEnd, ...suite.tokenizer.encode(' trailing')]);
    expect(engine.calls.length).toBe(1);
    expect(result.tokens.responseIds).toEqual([...before, imEnd]);
    expect(result.tokens.turns.map((t) => t.finishReason)).toEqual(['stop']);
  });

  it('ends the turn at a stop string the aborted segment completed within itself (kept through its last token)', async () => {
    const ids = suite.tokenizer.encode('The product is <answer>42</answer>');
    const { result, engine } = await abortedWith(ids, { stop: ['</answer>'] });
    expect(engine.calls.length).toBe(1);
    expect({ finishReason: result.outcome.finishReason, truncated: result.truncated }).toEqual({ finishReason: 'answer', truncated: false });
    expect(result.tokens.responseIds).toEqual(ids);
    expect(result.tokens.turns.map((t) => t.finishReason)).toEqual(['stop']);
  });

  it('cuts an aborted segment at the token completing a stop string when the engine returned more after it', async () => {
    const upTo = suite.tokenizer.encode('The product is <answer>42</answer>');
    const ids = [...upTo, ...suite.tokenizer.encode(' and then more words')];
    const { result, engine } = await abortedWith(ids, { stop: ['</answer>'] });
    expect(engine.calls.length).toBe(1);
    const kept = result.tokens.responseIds;
    expect(kept).toEqual(ids.slice(0, kept.length));
    expect(suite.tokenizer.decode(kept)).toMatch(/<\/answer>$/u);
    expect(suite.tokenizer.decode(kept.slice(0, -1))).not.toContain('</answer>');
  });

  it('ends a continued turn whose continuation was aborted after its stop token, or after completing a stop string begun before', async () => {
    const imEnd = suite.tokenizer.tokenId('<|im_end|>')!;
    for (const [second, stop] of [
      [[...suite.tokenizer.encode('2</answer>'), imEnd], []],
      [suite.tokenizer.encode('wer> and more'), ['</answer>']],
    ] as const) {
      const pool = suite.makePool();
      const first = suite.tokenizer.encode(stop.length > 0 ? 'The product is <answer>42</ans' : 'The product is <answer>4');
      const engine: InMemoryEngineClient = new InMemoryEngineClient({
        respond: (request) => answer(request === engine.calls[0] ? first : request === engine.calls[1] ? [...second] : suite.tokenizer.encode(' ramble'), 'abort'),
      });
      pool.add(engine, { id: 'a', model: 'm', maxConcurrency: 4, maxModelLen: 40960 });
      const result = await runLoop(makeSample({ stop: [...stop] }), pool);
      expect(engine.calls.length).toBe(2);
      expect({ finishReason: result.outcome.finishReason, truncated: result.truncated }).toEqual({ finishReason: 'answer', truncated: false });
      expect(result.outcome.messages.at(-1)!.content).toBe('The product is <answer>42</answer>');
      expect(result.tokens.turns.map((t) => t.finishReason)).toEqual(['abort', 'stop']);
    }
  });

  it('still continues a turn aborted mid-way (no stop token, no stop string): the fix does not end live turns', async () => {
    const pool = suite.makePool();
    const imEnd = suite.tokenizer.tokenId('<|im_end|>')!;
    const engine: InMemoryEngineClient = new InMemoryEngineClient({
      respond: (request) =>
        request === engine.calls[0] ? answer(suite.tokenizer.encode('The product is <answer>4'), 'abort') : answer([...suite.tokenizer.encode('2</answer>'), imEnd], 'stop'),
    });
    pool.add(engine, { id: 'a', model: 'm', maxConcurrency: 4, maxModelLen: 40960 });
    const result = await runLoop(makeSample({ stop: ['</answer>'] }), pool);
    expect(engine.calls.length).toBe(2);
    expect(result.outcome.messages.at(-1)!.content).toBe('The product is <answer>42</answer>');
    expect(result.tokens.turns.map((t) => t.finishReason)).toEqual(['abort', 'stop']);
  });
});
