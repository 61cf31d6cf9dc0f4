import { describe, expect, it } from 'vitest';
import { RolloutError } from '../../../src/errors.js';
import { createMathEnvironment } from '../../../src/environments/math/math-environment.js';
import type { MathInstance } from '../../../src/environments/math/instance.js';
import type { EpisodeOutcome } from '../../../src/environments/types.js';
import type { ChatMessage } from '../../../src/tokens/types.js';
import { ToolRegistry } from '../../../src/tools/registry.js';
import type { Tool } from '../../../src/tools/types.js';
import { FakeSandbox } from '../fake-sandbox.js';

function fakeTool(name: string): Tool {
  return { name, description: name, parameters: { type: 'object' }, run: async () => ({ output: '', outcome: 'ok' }) };
}

const math = createMathEnvironment({
  toolRegistry: new ToolRegistry().register('python', () => fakeTool('python')).register('bash', () => fakeTool('bash')).register('finish', () => fakeTool('finish')),
});

function invalidField(instance: unknown): string | undefined {
  try {
    math.validate(instance);
    return undefined;
  } catch (err: unknown) {
    expect(err).toBeInstanceOf(RolloutError);
    expect((err as RolloutError).code).toBe('invalid_argument');
    expect((err as RolloutError).message.startsWith(`${(err as RolloutError).field}: `)).toBe(true);
    return (err as RolloutError).field;
  }
}

async function evaluate(instance: MathInstance, outcome: Partial<EpisodeOutcome> & { messages: ChatMessage[] }) {
  const sandbox = new FakeSandbox();
  const result = await math.evaluate({ instance, sandbox, signal: new AbortController().signal, outcome: { finishReason: 'answer', ...outcome } });
  expect(sandbox.calls).toEqual([]); // evaluation never needs the sandbox
  return result;
}

const assistant = (content: string): ChatMessage => ({ role: 'assistant', content });

describe('math environment: validation', () => {
  it('accepts string and number answers, trims, and drops extra fields', () => {
    expect(math.validate({ problem: ' 1+1? ', answer: ' 2 ', level: 'Level 1' })).toEqual({ problem: '1+1?', answer: '2' });
    expect(math.validate({ problem: '1+1?', answer: 2 })).toEqual({ problem: '1+1?', answer: 2 });
  });

  it.each([
    [undefined, 'instance'],
    ['a string', 'instance'],
    [[1, 2], 'instance'],
    [{ answer: '2' }, 'instance.problem'],
    [{ problem: '', answer: '2' }, 'instance.problem'],
    [{ problem: '   ', answer: '2' }, 'instance.problem'],
    [{ problem: 7, answer: '2' }, 'instance.problem'],
    [{ problem: 'p' }, 'instance.answer'],
    [{ problem: 'p', answer: '' }, 'instance.answer'],
    [{ problem: 'p', answer: Number.NaN }, 'instance.answer'],
    [{ problem: 'p', answer: { value: 2 } }, 'instance.answer'],
    [{ problem: 'p', answer: 'x'.repeat(1001) }, 'instance.answer'],
  ])('%j is rejected naming %s', (instance, field) => {
    expect(invalidField(instance)).toBe(field);
  });

  it('says "required" for a missing field', () => {
    expect(() => math.validate({ problem: 'p' })).toThrow('instance.answer: required');
  });

  it('publishes a JSON Schema and its tool names', () => {
    // Derived from the zod schema by defineEnvironment; extra fields are allowed (no additionalProperties: false).
    expect(math.instanceSchema).toMatchObject({ type: 'object', required: ['problem', 'answer'], description: expect.stringContaining('Extra fields are allowed') });
    expect(math.instanceSchema.additionalProperties).not.toBe(false);
    expect(Object.keys(math.instanceSchema.properties as object)).toEqual(['problem', 'answer', 'checker']);
    expect(math.toolNames).toEqual(['python', 'bash', 'finish']);
  });
});

describe('math environment: construction', () => {
  it('refuses a tool registry without python, bash and finish', () => {
    expect(() => createMathEnvironment({ toolRegistry: new ToolRegistry().register('python', () => fakeTool('python')) })).toThrow(/needs tools: bash, finish/);
  });

  it('uses the built-in tools by default', () => {
    const builtIn = createMathEnvironment();
    expect(builtIn.tools(builtIn.validate({ problem: 'p', answer: 1 })).map((t) => t.name)).toEqual(['python', 'bash', 'finish']);
  });
});

describe('math environment: episode', () => {
  it('starts with a system prompt naming the tools and the problem as the user message', async () => {
    const instance = math.validate({ problem: 'What is 2+2?', answer: 4 });
    const { messages } = await math.init({ instance, sandbox: new FakeSandbox(), signal: new AbortController().signal });
    expect(messages).toHaveLength(2);
    expect(messages[0]!.role).toBe('system');
    expect(messages[0]!.content).toContain('`python`');
    expect(messages[0]!.content).toContain('`bash`');
    expect(messages[0]!.content).toContain('`finish`');
    expect(messages[0]!.content).toContain('\\boxed{}');
    expect(messages[1]).toEqual({ role: 'user', content: 'What is 2+2?' });
  });

  it('offers python, bash and finish tools, built once and shared by every sample (they keep no per-sample state)', () => {
    const instance = math.validate({ problem: 'p', answer: 1 });
    const first = math.tools(instance);
    expect(first.map((t) => t.name)).toEqual(['python', 'bash', 'finish']);
    expect(math.tools(math.validate({ problem: 'q', answer: 2 }))[0]).toBe(first[0]);
  });
});

describe('math environment: evaluate', () => {
  const instance: MathInstance = { problem: 'Half of one?', answer: '\\frac{1}{2}' };

  it('rewards a correct boxed answer with nested braces', async () => {
    const result = await evaluate(instance, { messages: [assistant('So it is \\boxed{\\dfrac{1}{2}}.')] });
    expect(result).toEqual({
      reward: 1,
      details: { correct: 1, has_answer: 1 },
      report: { extracted: '\\dfrac{1}{2}', reference: '\\frac{1}{2}', method: 'boxed', checker: 'builtin', comparison: 'text' },
    });
  });

  it('prefers the finish tool answer over a box', async () => {
    const result = await evaluate(instance, { messages: [assistant('\\boxed{0.5}')], finishAnswer: '0.25', finishReason: 'finish_tool' });
    expect(result.reward).toBe(0);
    expect(result.details).toEqual({ correct: 0, has_answer: 1 });
    expect(result.report).toMatchObject({ extracted: '0.25', method: 'finish_tool' });
  });

  it('rewards a correct finish answer against a numeric reference', async () => {
    const result = await evaluate({ problem: 'p', answer: 1000 }, { messages: [], finishAnswer: '1,000' });
    expect(result.reward).toBe(1);
    expect(result.report).toMatchObject({ reference: '1000', method: 'finish_tool' });
  });

  it('caps the extracted answer in the report, saying how long it was: a 1 MB answer is not copied into every report', async () => {
    const huge = `1${'0'.repeat(999_999)}`;
    for (const outcome of [{ messages: [], finishAnswer: huge }, { messages: [assistant(`\\boxed{${huge}}`)] }]) {
      const result = await evaluate(instance, outcome);
      expect(result.details).toEqual({ correct: 0, has_answer: 1 });
      expect(JSON.stringify(result.report).length).toBeLessThan(2_000);
      expect(result.report).toMatchObject({ extracted: `${huge.slice(0, 1000)}…`, extracted_chars: 1_000_000 });
    }
    // A short answer is reported whole, without the length.
    expect((await evaluate(instance, { messages: [], finishAnswer: '0.5' })).report).not.toHaveProperty('extracted_chars');
  });

  it('gives 0 for a wrong answer', async () => {
    const result = await evaluate(instance, { messages: [assistant('\\boxed{0.333}')] });
    expect(result.reward).toBe(0);
    expect(result.details).toEqual({ correct: 0, has_answer: 1 });
  });

  it('gives 0 with has_answer 0 when there is no answer (a model failure, not an error)', async () => {
    const result = await evaluate(instance, { messages: [assistant('\\boxed{1/2}'), { role: 'tool', content: 'ok' }, assistant('I am not sure.')], finishReason: 'max_turns' });
    expect(result).toEqual({
      reward: 0,
      details: { correct: 0, has_answer: 0 },
      report: { extracted: null, reference: '\\frac{1}{2}', method: 'none', checker: 'builtin', comparison: 'none' },
    });
  });
});
