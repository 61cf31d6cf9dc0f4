import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { HermesToolCallParser } from '../../src/tools/hermes-parser.js';

const parser = new HermesToolCallParser();

describe('HermesToolCallParser', () => {
  it('parses one call in the Qwen form', () => {
    const text = 'Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1 + 1)"}}\n</tool_call>';
    expect(parser.parse(text)).toEqual({ calls: [{ name: 'python', arguments: { code: 'print(1 + 1)' } }], errors: [] });
  });

  it('parses several calls in order, ignoring text between them', () => {
    const text =
      '<tool_call>\n{"name": "python", "arguments": {"code": "a"}}\n</tool_call>\nthen\n' +
      '<tool_call>{"name": "finish", "arguments": {"answer": "42"}}</tool_call> done';
    expect(parser.parse(text).calls).toEqual([
      { name: 'python', arguments: { code: 'a' } },
      { name: 'finish', arguments: { answer: '42' } },
    ]);
  });

  it('returns nothing for a plain answer', () => {
    expect(parser.parse('The answer is 42.')).toEqual({ calls: [], errors: [] });
    expect(parser.parse('')).toEqual({ calls: [], errors: [] });
  });

  it('accepts arguments encoded as a JSON string, `parameters`, and missing arguments', () => {
    const text =
      '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(2)\\"}"}</tool_call>' +
      '<tool_call>{"name": "finish", "parameters": {"answer": "x"}}</tool_call>' +
      '<tool_call>{"name": "noop"}</tool_call>';
    expect(parser.parse(text)).toEqual({
      calls: [
        { name: 'python', arguments: { code: 'print(2)' } },
        { name: 'finish', arguments: { answer: 'x' } },
        { name: 'noop', arguments: {} },
      ],
      errors: [],
    });
  });

  it('reports bad JSON with a hint, and keeps the good calls', () => {
    const text = "<tool_call>{'name': 'python'}</tool_call><tool_call>{\"name\": \"finish\", \"arguments\": {\"answer\": \"1\"}}</tool_call>";
    const parsed = parser.parse(text);
    expect(parsed.calls).toEqual([{ name: 'finish', arguments: { answer: '1' } }]);
    expect(parsed.errors).toHaveLength(1);
    expect(parsed.errors[0]).toMatch(/^tool call 1: invalid JSON \(.+\); write <tool_call>\{"name"/);
  });

  it('reports an unterminated tag, at the end or before the next call', () => {
    expect(parser.parse('<tool_call>{"name": "python", "arguments": {"code": "1"}}').errors).toEqual([
      'tool call 1: <tool_call> is not closed by </tool_call>; write <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>',
    ]);
    const parsed = parser.parse('<tool_call>{"name": "a"}\n<tool_call>{"name": "b"}</tool_call>');
    expect(parsed.calls).toEqual([{ name: 'b', arguments: {} }]);
    expect(parsed.errors).toHaveLength(1);
    expect(parsed.errors[0]).toMatch(/^tool call 1: <tool_call> is not closed/);
  });

  it('reports a missing name, non-object arguments and non-object bodies', () => {
    const cases: Array<[string, RegExp]> = [
      ['{"arguments": {}}', /missing "name"/],
      ['{"name": "", "arguments": {}}', /missing "name"/],
      ['{"name": "python", "arguments": [1, 2]}', /python: "arguments" must be a JSON object .* got an array/],
      ['{"name": "python", "arguments": 3}', /got a number/],
      ['{"name": "python", "arguments": "print(1)"}', /is a string that is not valid JSON/],
      ['{"name": "python", "arguments": "[1]"}', /a string holding an array/],
      ['[{"name": "python"}]', /expected one JSON object, got an array/],
      ['   ', /empty <tool_call>/],
    ];
    for (const [body, pattern] of cases) {
      const parsed = parser.parse(`<tool_call>${body}</tool_call>`);
      expect(parsed.calls, body).toEqual([]);
      expect(parsed.errors, body).toHaveLength(1);
      expect(parsed.errors[0], body).toMatch(pattern);
    }
  });

  it('ignores a stray closing tag', () => {
    expect(parser.parse('no call here </tool_call>')).toEqual({ calls: [], errors: [] });
  });

  it('never throws, and accounts for every opening tag', () => {
    const piece = fc.oneof(fc.constantFrom('<tool_call>', '</tool_call>', '{"name": "x", "arguments": {}}', '{', '"', '\n'), fc.string({ maxLength: 8 }));
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 12 }), (pieces) => {
        const text = pieces.join('');
        const parsed = parser.parse(text);
        const opens = text.split('<tool_call>').length - 1;
        expect(parsed.calls.length + parsed.errors.length).toBe(opens);
      }),
    );
  });
});
