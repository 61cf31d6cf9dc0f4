import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineEnvironment, parseInstance } from '../../src/environments/define.js';
import { RolloutError } from '../../src/errors.js';
import { defineTool } from '../../src/tools/define-tool.js';
import type { Tool } from '../../src/tools/types.js';
import { FakeSandbox } from './fake-sandbox.js';

const shout = defineTool({
  name: 'shout',
  description: 'Upper-cases its text.',
  args: z.object({ text: z.string() }),
  run: async ({ text }) => ({ output: text.toUpperCase(), outcome: 'ok' }),
});

const wordEnv = defineEnvironment({
  name: 'word',
  description: 'Say the word.',
  instance: z.object({ word: z.string().min(1), times: z.number().int().positive().default(1), extra: z.object({ note: z.string() }).optional() }),
  prompt: ({ word, times }) => [{ role: 'user', content: `Say "${word}" ${times} times.` }],
  tools: [shout, 'finish'],
  evaluate: async ({ instance, outcome }) => {
    const correct = outcome.finishAnswer === instance.word ? 1 : 0;
    return { reward: correct, details: { correct }, report: {} };
  },
});

function rejection(fn: () => unknown): RolloutError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(RolloutError);
    return err as RolloutError;
  }
  throw new Error('expected a rejection');
}

describe('defineEnvironment', () => {
  it('validates with the zod schema and hands hooks its output (defaults applied, unknown keys dropped)', () => {
    expect(wordEnv.validate({ word: 'hi', id: 7 })).toEqual({ word: 'hi', times: 1 });
  });

  it('names the offending field: "required" when missing, zod\'s reason otherwise, nested paths joined', () => {
    expect(rejection(() => wordEnv.validate({}))).toMatchObject({ code: 'invalid_argument', field: 'instance.word', message: 'instance.word: required' });
    expect(rejection(() => wordEnv.validate({ word: 'x', times: 0 }))).toMatchObject({ field: 'instance.times', message: expect.stringMatching(/^instance\.times: .*>0/) });
    expect(rejection(() => wordEnv.validate({ word: 'x', extra: { note: 5 } }))).toMatchObject({ field: 'instance.extra.note' });
    expect(rejection(() => wordEnv.validate('word'))).toMatchObject({ field: 'instance', message: expect.stringContaining('expected object') });
  });

  it('explains a union by the branch the value resembles most', () => {
    const schema = z.union([z.object({ prompt: z.string(), test: z.string(), entry_point: z.string() }), z.object({ prompt: z.string(), tests: z.array(z.object({ input: z.string() })) })]);
    expect(rejection(() => parseInstance(schema, { prompt: 'p', tests: [{ input: 1 }] })).field).toBe('instance.tests.0.input');
    expect(rejection(() => parseInstance(schema, { prompt: 'p', test: 't' })).field).toBe('instance.entry_point');
    expect(rejection(() => parseInstance(schema, { prompt: 'p', test: 't', entry_point: 3 })).message).not.toContain('required');
  });

  it('exposes the schema\'s input side as JSON Schema and the tool names for ListEnvironments', () => {
    expect(wordEnv.instanceSchema).toMatchObject({ type: 'object', required: ['word'], properties: { word: { type: 'string', minLength: 1 }, times: { type: 'integer' } } });
    expect(wordEnv.toolNames).toEqual(['shout', 'finish']);
    const instance = wordEnv.validate({ word: 'a' });
    expect(wordEnv.tools(instance)).toBe(wordEnv.tools(instance)); // one shared array: schemas are cached by it
  });

  it('derives init from prompt, and prompt is exposed for admission-time measuring', async () => {
    const instance = wordEnv.validate({ word: 'a', times: 2 });
    const sandbox = new FakeSandbox();
    const { messages } = await wordEnv.init({ instance, sandbox, signal: new AbortController().signal });
    expect(messages).toEqual(wordEnv.prompt!(instance));
    expect(sandbox.calls).toEqual([]);
  });

  it('passes a per-instance sandbox request through, and a constant one as a function', () => {
    const perInstance = defineEnvironment({ ...base(), sandbox: (i: { n: number }) => ({ limits: { memoryMb: i.n } }) });
    expect(perInstance.sandbox!({ n: 64 })).toEqual({ limits: { memoryMb: 64 } });
    const constant = defineEnvironment({ ...base(), sandbox: { network: true } });
    expect(constant.sandbox!({ n: 1 })).toEqual({ network: true });
    expect(defineEnvironment(base()).sandbox).toBeUndefined();
  });

  it('refuses definitions that cannot work: no init nor prompt, a shared tool with dispose, an unknown tool name', () => {
    const { prompt: _prompt, ...noPrompt } = base();
    expect(() => defineEnvironment(noPrompt)).toThrow(/give init, prompt, or both/);
    const disposable: Tool = { ...shout, dispose: async () => undefined };
    expect(() => defineEnvironment({ ...base(), tools: [disposable] })).toThrow(/cannot be shared/);
    expect(() => defineEnvironment({ ...base(), tools: ['nope'] })).toThrow(/unknown tool nope/);
  });

  it('calls a tools function per sample and reports the declared names', () => {
    let built = 0;
    const env = defineEnvironment({ ...base(), tools: () => (built++, [shout]), toolNames: ['shout'] });
    env.tools({ n: 1 });
    env.tools({ n: 1 });
    expect(built).toBe(2);
    expect(env.toolNames).toEqual(['shout']);
  });
});

function base() {
  return {
    name: 'b',
    description: 'd',
    instance: z.object({ n: z.number() }),
    prompt: () => [{ role: 'user' as const, content: 'x' }],
    evaluate: async () => ({ reward: 0, details: {}, report: {} }),
  };
}
