import { describe, expect, it } from 'vitest';
import { DeepSeekV3ToolCallParser } from '../../src/tools/deepseek-v3-parser.js';
import { HermesToolCallParser } from '../../src/tools/hermes-parser.js';

// Review s36 (same flaw class as item 2): an opening tag inside a call's JSON strings, with no closing tag there, was
// taken for a second, unclosed call — the call was lost to an error although its JSON and closing tag were whole.

describe('review s36: an opening tag inside a call\u2019s JSON strings', () => {
  it('hermes: <tool_call> in the code of a call is argument text', () => {
    const parser = new HermesToolCallParser();
    const calls = [{ name: 'python', arguments: { code: 'print("<tool_call>")' } }];
    expect(parser.parse(parser.format(calls))).toEqual({ calls, errors: [] });
    expect(parser.parse('<tool_call>{"name": "python", "arguments": {"code": "s = \'<tool_call>\'"}}</tool_call>').calls).toHaveLength(1);
  });

  it('deepseek_v3: <｜tool▁call▁begin｜> in the code of a call is argument text', () => {
    const parser = new DeepSeekV3ToolCallParser();
    const calls = [{ name: 'python', arguments: { code: 'MARK = "<｜tool▁call▁begin｜>"' } }, { name: 'bash', arguments: { cmd: 'ls' } }];
    expect(parser.parse(parser.format(calls))).toEqual({ calls, errors: [] });
  });

  it('a real unclosed call before the next one is still reported as unclosed', () => {
    const parser = new HermesToolCallParser();
    const parsed = parser.parse('<tool_call>{"name": "a", "arguments": {}\n<tool_call>{"name": "b", "arguments": {}}</tool_call>');
    expect(parsed.calls).toEqual([{ name: 'b', arguments: {} }]);
    expect(parsed.errors).toHaveLength(1);
    expect(parsed.errors[0]).toMatch(/^tool call 1: <tool_call> is not closed/u);
  });
});
