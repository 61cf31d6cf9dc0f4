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

  it('never throws, and accounts for every opening tag (the unclosed ones after the last closing tag in one error)', () => {
    const piece = fc.oneof(fc.constantFrom('<tool_call>', '</tool_call>', '{"name": "x", "arguments": {}}', '{', '"', '\n'), fc.string({ maxLength: 8 }));
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 12 }), (pieces) => {
        const text = pieces.join('');
        const parsed = parser.parse(text);
        const opens = text.split('<tool_call>').length - 1;
        const grouped = parsed.errors.reduce((n, e) => n + Number(/\(and the (\d+) after it\)/.exec(e)?.[1] ?? 0), 0);
        expect(parsed.calls.length + parsed.errors.length + grouped).toBe(opens);
      }),
    );
  });

  it('stays linear on degenerate output: thousands of opening tags are one error, however far a closing tag is', () => {
    const many = '<tool_call>'.repeat(20_000);
    const started = performance.now();
    expect(parser.parse(many).errors).toEqual([expect.stringMatching(/^tool call 1 \(and the 19999 after it\): <tool_call> is not closed/)]);
    const beforeOneClose = parser.parse(`${many}{"name": "x"}</tool_call>`);
    expect(beforeOneClose.calls).toEqual([{ name: 'x', arguments: {} }]);
    expect(beforeOneClose.errors).toHaveLength(19_999);
    expect(performance.now() - started).toBeLessThan(500);
  });

  it('reads calls only after the reasoning: a tag mentioned or a call drafted inside <think> is neither an error nor run', () => {
    expect(parser.parse('<think>\nI could wrap a call in <tool_call> tags, but 2+2 is easy.\n</think>\n\nThe answer is \\boxed{4}.')).toEqual({ calls: [], errors: [] });
    const drafted = '<think>\nDraft: <tool_call>\n{"name": "bash", "arguments": {"cmd": "rm -rf /work"}}\n</tool_call> -- no, unsafe.\n</think>\n\nI will not run that.';
    expect(parser.parse(drafted).calls).toEqual([]);
    const after = '<think>\nneed python\n</think>\n<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>';
    expect(parser.parse(after).calls).toEqual([{ name: 'python', arguments: { code: '1' } }]);
    // Cut inside its reasoning (a length stop): no call, even a complete one.
    expect(parser.parse('<think>\n<tool_call>\n{"name": "python", "arguments": {}}\n</tool_call>').calls).toEqual([]);
  });
});
