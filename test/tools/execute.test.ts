import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BubblewrapDriver, type BubblewrapSandbox } from '../../src/sandboxes/bwrap.js';
import { z } from 'zod';
import { defineTool } from '../../src/tools/define-tool.js';
import { executeToolCalls, MAX_CALLS_PER_MESSAGE, MAX_ERROR_OBSERVATIONS } from '../../src/tools/execute.js';
import { HermesToolCallParser } from '../../src/tools/hermes-parser.js';
import { defaultToolRegistry, toolSchemas, ToolRegistry } from '../../src/tools/registry.js';
import type { Tool, ToolContext, ToolResult } from '../../src/tools/types.js';
import { RolloutError } from '../../src/errors.js';
import { testSpec } from '../sandboxes/helpers.js';

const parser = new HermesToolCallParser();
const call = (name: string, args: unknown): string => `<tool_call>\n${JSON.stringify({ name, arguments: args })}\n</tool_call>`;

describe('executeToolCalls', () => {
  let sandbox: BubblewrapSandbox;
  let context: ToolContext;
  let tools: Tool[];

  beforeAll(async () => {
    sandbox = await new BubblewrapDriver().start(testSpec());
    context = { sandbox, signal: new AbortController().signal };
    tools = defaultToolRegistry().create(['python', 'finish']);
  });

  afterAll(async () => {
    await sandbox?.stop();
  });

  it('runs calls in order in the same sandbox', async () => {
    const text = call('python', { code: 'open("n.txt", "w").write("7")' }) + call('python', { code: 'print(open("n.txt").read())' });
    const observations = await executeToolCalls(parser.parse(text), tools, context);
    expect(observations).toEqual([
      { toolName: 'python', outcome: 'ok', output: '(no output)' },
      { toolName: 'python', outcome: 'ok', output: '7' },
    ]);
  });

  it('ends with finish and its answer, skipping later calls', async () => {
    const text = call('finish', { answer: '42' }) + call('python', { code: 'print(1)' });
    const observations = await executeToolCalls(parser.parse(text), tools, context);
    expect(observations).toEqual([
      { toolName: 'finish', outcome: 'finish', output: 'Answer submitted.', answer: '42' },
      { toolName: 'python', outcome: 'error', output: 'Not run: finish was already called in this message.' },
    ]);
  });

  it('answers an unknown tool with the list of available tools', async () => {
    const [observation] = await executeToolCalls(parser.parse(call('bash', { cmd: 'ls' })), tools, context);
    expect(observation).toEqual({ toolName: 'bash', outcome: 'malformed', output: 'Error: unknown tool "bash". Available tools: python, finish.' });
  });

  it('answers invalid arguments with the reason, without running the tool', async () => {
    const observations = await executeToolCalls(parser.parse(call('python', { source: 'print(1)' }) + call('finish', { answer: 5 })), tools, context);
    expect(observations.map((o) => o.outcome)).toEqual(['malformed', 'malformed']);
    expect(observations[0]?.output).toBe('Error: invalid arguments for python: missing required argument "code" (string)');
    expect(observations[1]?.output).toMatch(/^Error: invalid arguments for finish: "answer": .*expected string/);
  });

  it('turns parse errors into malformed observations after the calls', async () => {
    const text = call('python', { code: 'print(3)' }) + '<tool_call>{"name": python}</tool_call>';
    const observations = await executeToolCalls(parser.parse(text), tools, context);
    expect(observations[0]).toEqual({ toolName: 'python', outcome: 'ok', output: '3' });
    expect(observations[1]).toMatchObject({ toolName: '', outcome: 'malformed', output: expect.stringMatching(/^Error: tool call 2: invalid JSON/) });
  });

  it('reports a few parse errors one by one and counts the rest in one observation', async () => {
    const errors = Array.from({ length: 1_000 }, (_, i) => `problem ${i + 1}`);
    const observations = await executeToolCalls({ calls: [], errors }, tools, context);
    expect(observations).toHaveLength(MAX_ERROR_OBSERVATIONS + 1);
    expect(observations.slice(0, 2).map((o) => o.output)).toEqual(['Error: problem 1', 'Error: problem 2']);
    expect(observations.at(-1)).toEqual({ toolName: '', outcome: 'malformed', output: `Error: ${1_000 - MAX_ERROR_OBSERVATIONS} more malformed tool calls in this message (not listed)` });
  });

  it('runs a few calls of one message and answers the rest with one observation, not thousands of runs', async () => {
    // A degenerate completion of 20-token calls, each answered with a page of output, made ~100 observation tokens per
    // sampled token (2,000 calls: 2.7 MB to tokenize), each call a process or a file read.
    let runs = 0;
    const counter = defineTool({ name: 'count', description: 'Counts.', args: z.object({}), run: async () => ({ output: `run ${++runs}`, outcome: 'ok' }) });
    const parsed = parser.parse(call('count', {}).repeat(2_000) + '<tool_call>{"name": 1}</tool_call>');
    expect(parsed.calls).toHaveLength(2_000);
    const observations = await executeToolCalls(parsed, [counter], context);
    expect(runs).toBe(MAX_CALLS_PER_MESSAGE);
    expect(observations).toHaveLength(MAX_CALLS_PER_MESSAGE + 2);
    expect(observations[MAX_CALLS_PER_MESSAGE]).toEqual({
      toolName: '',
      outcome: 'malformed',
      output: `Error: ${2_000 - MAX_CALLS_PER_MESSAGE} more tool calls in this message were not run (at most ${MAX_CALLS_PER_MESSAGE} per message); call them again in your next message if you still need them.`,
    });
    expect(observations.at(-1)).toMatchObject({ outcome: 'malformed', output: expect.stringMatching(/^Error: tool call 2001: missing "name"/) });
  });

  it('runs as many calls of one message as the caller allows (the server config), and counts the rest', async () => {
    let runs = 0;
    const counter = defineTool({ name: 'count', description: 'Counts.', args: z.object({}), run: async () => ({ output: `run ${++runs}`, outcome: 'ok' }) });
    const observations = await executeToolCalls(parser.parse(call('count', {}).repeat(5)), [counter], context, { maxCallsPerMessage: 2 });
    expect(runs).toBe(2);
    expect(observations.map((o) => o.output)).toEqual([
      'run 1',
      'run 2',
      'Error: 3 more tool calls in this message were not run (at most 2 per message); call them again in your next message if you still need them.',
    ]);
  });

  it('fails the trajectory as ENVIRONMENT_ERROR when a plugin tool breaks its contract, never a crash or an observation', async () => {
    // A plugin tool's validate() or run() is the environment's code: when it throws or answers out of contract, the
    // task was valid and the model did nothing wrong.
    const base = { description: 'A plugin tool.', parameters: {}, run: async () => ({ output: 'ran', outcome: 'ok' as const }) };
    const throwingValidate = { ...base, name: 'throws', validate: (): never => { throw new TypeError('schema bug'); } };
    const garbageValidate = { ...base, name: 'garbage', validate: () => undefined as unknown as { ok: true; args: Record<string, unknown> } };
    const garbageRun = { ...base, name: 'badrun', run: async () => ({ output: 42, outcome: 'fine' }) as unknown as ToolResult };
    const plugins: Tool[] = [throwingValidate, garbageValidate, garbageRun];
    for (const [name, why] of [['throws', /validate threw: schema bug/], ['garbage', /validate returned .*undefined/], ['badrun', /returned an invalid result/]] as const) {
      const failure = executeToolCalls(parser.parse(call(name, {})), plugins, context);
      await expect(failure).rejects.toBeInstanceOf(RolloutError);
      await expect(failure).rejects.toMatchObject({ code: 'environment_error', message: expect.stringMatching(new RegExp(`^tool ${name} failed: ${why.source}`)) });
    }
  });

  it('throws infrastructure failures instead of showing them to the model', async () => {
    const dead = await new BubblewrapDriver().start(testSpec());
    await dead.stop();
    await expect(executeToolCalls(parser.parse(call('python', { code: 'print(1)' })), tools, { sandbox: dead, signal: context.signal })).rejects.toMatchObject({
      code: 'sandbox_error',
    });
    const aborted = new AbortController();
    aborted.abort();
    await expect(executeToolCalls(parser.parse(call('python', { code: 'print(1)' })), tools, { sandbox, signal: aborted.signal })).rejects.toMatchObject({
      code: 'cancelled',
    });
  });
});

describe('tool registry', () => {
  it('creates fresh tools by name and describes them for the chat template', () => {
    const registry = defaultToolRegistry();
    expect(registry.names()).toEqual(['python', 'bash', 'str_replace_editor', 'finish']);
    const [a, b] = [registry.create(['python'])[0], registry.create(['python'])[0]];
    expect(a).not.toBe(b);
    expect(toolSchemas(registry.create(['finish']))).toEqual([
      {
        type: 'function',
        function: {
          name: 'finish',
          description: expect.any(String),
          parameters: { type: 'object', properties: { answer: { type: 'string', description: 'Your final answer.' } }, required: ['answer'], additionalProperties: false },
        },
      },
    ]);
  });

  it('rejects unknown and duplicate names', () => {
    expect(() => defaultToolRegistry().create(['nope'])).toThrow(/unknown tool nope; registered: python, bash, str_replace_editor, finish/);
    expect(() => new ToolRegistry().register('x', () => nullTool()).register('x', () => nullTool())).toThrow(/already registered/);
  });
});

function nullTool(): Tool {
  return { name: 'x', description: '', parameters: {}, run: async () => ({ output: '', outcome: 'ok' }) };
}
