import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { pythonJson } from '../../src/tools/call-json.js';
import { DeepSeekV3ToolCallParser } from '../../src/tools/deepseek-v3-parser.js';
import { defineTool } from '../../src/tools/define-tool.js';
import { executeToolCalls } from '../../src/tools/execute.js';
import { HermesToolCallParser } from '../../src/tools/hermes-parser.js';
import { Llama3JsonToolCallParser } from '../../src/tools/llama3-json-parser.js';
import type { ToolCallParser } from '../../src/tools/types.js';

// Review s36, item 3: arguments nested 100,000 deep ([[[[...]]]] from the model) parse (V8's JSON.parse is iterative),
// but every recursive walk after the parser overflows the stack on them: JSON.stringify, zod's z.json(), a tool's own
// canonicalization. A tool that forwards its arguments as JSON then threw a RangeError, which executeToolCalls reports
// as environment_error — an infrastructure failure caused by the policy's output. The parsers bound nesting instead:
// deeper arguments are a malformed call the model sees, and every walk after them is shallow.

const N = 100_000;
const deep = '['.repeat(N) + ']'.repeat(N);
const deepObject = '{"a": '.repeat(N) + '1' + '}'.repeat(N);

const parsers: [ToolCallParser, (args: string) => string][] = [
  [new HermesToolCallParser(), (args) => `<tool_call>{"name": "echo_json", "arguments": ${args}}</tool_call>`],
  [new HermesToolCallParser(), (args) => `<tool_call>{"name": "echo_json", "arguments": ${JSON.stringify(args)}}</tool_call>`],
  [new Llama3JsonToolCallParser(), (args) => `{"name": "echo_json", "parameters": ${args}}`],
  [new DeepSeekV3ToolCallParser(), (args) => `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>echo_json\n\`\`\`json\n${args}\n\`\`\`<｜tool▁call▁end｜><｜tool▁calls▁end｜>`],
];

/** A plugin-style tool that sends its arguments on as JSON (as a tool calling a web API does). */
const echoJson = defineTool({
  name: 'echo_json',
  description: 'echoes its data as JSON',
  args: z.object({ data: z.unknown() }).loose(),
  run: (args) => Promise.resolve({ output: JSON.stringify(args), outcome: 'ok' }),
});

const context = { sandbox: undefined as never, signal: new AbortController().signal };

describe('review s36: deeply nested tool-call arguments', () => {
  for (const [parser, wrap] of parsers) {
    for (const [label, args] of [
      ['an array', `{"data": ${deep}}`],
      ['objects', `{"data": ${deepObject}}`],
    ] as const) {
      it(`${parser.name} (${wrap('').slice(0, 12)}…): ${label} 100,000 deep is a malformed call observed by the model, not environment_error`, async () => {
        const parsed = parser.parse(wrap(args));
        const observations = await executeToolCalls(parsed, [echoJson], context);
        expect(observations.map((o) => o.outcome)).toEqual(['malformed']);
        expect(parsed.calls).toEqual([]);
        expect(parsed.errors).toHaveLength(1);
        expect(parsed.errors[0]).toMatch(/nested deeper than \d+/u);
      });
    }
  }

  it('arguments nested as deep as allowed parse and run, and stringify', async () => {
    const parser = new HermesToolCallParser();
    const ok = '['.repeat(60) + ']'.repeat(60);
    const parsed = parser.parse(`<tool_call>{"name": "echo_json", "arguments": {"data": ${ok}}}</tool_call>`);
    expect(parsed.errors).toEqual([]);
    const [observation] = await executeToolCalls(parsed, [echoJson], context);
    expect(observation!.outcome).toBe('ok');
    expect(pythonJson(parsed.calls[0]!.arguments)).toBe(`{"data": ${ok}}`);
  });

  it('brackets inside strings do not count as nesting', () => {
    const parser = new HermesToolCallParser();
    const code = '['.repeat(10_000);
    const parsed = parser.parse(`<tool_call>${JSON.stringify({ name: 'python', arguments: { code } })}</tool_call>`);
    expect(parsed).toEqual({ calls: [{ name: 'python', arguments: { code } }], errors: [] });
  });
});
