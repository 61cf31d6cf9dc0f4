import { describe, expect, it } from 'vitest';
import { Llama3JsonToolCallParser } from '../../src/tools/llama3-json-parser.js';

const parser = new Llama3JsonToolCallParser();

describe('Llama3JsonToolCallParser (vLLM llama3_json behaviour)', () => {
  it('parses a whole-message JSON call with "parameters", with or without <|python_tag|>', () => {
    const call = { name: 'python', arguments: { code: 'print(1)' } };
    expect(parser.parse('{"name": "python", "parameters": {"code": "print(1)"}}')).toEqual({ calls: [call], errors: [] });
    expect(parser.parse('<|python_tag|>{"name": "python", "parameters": {"code": "print(1)"}}')).toEqual({ calls: [call], errors: [] });
    expect(parser.parse('  {"name": "python", "arguments": {"code": "print(1)"}}\n')).toEqual({ calls: [call], errors: [] });
  });

  it('parses several calls separated by semicolons', () => {
    const text = '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": "}{"}}';
    expect(parser.parse(text).calls).toEqual([{ name: 'a', arguments: {} }, { name: 'b', arguments: { x: '}{' } }]);
  });

  it('treats prose, and JSON that is not a call, as a plain answer', () => {
    expect(parser.parse('The answer is {42}.')).toEqual({ calls: [], errors: [] });
    expect(parser.parse('{"answer": 42}')).toEqual({ calls: [], errors: [] });
    expect(parser.parse('I will call {"name": "python"} now')).toEqual({ calls: [], errors: [] });
  });

  it('reports a broken call the model clearly meant, instead of ending the episode on it', () => {
    expect(parser.parse('{"name": "python", "parameters": {"code": "x"}').errors[0]).toMatch(/not closed/);
    expect(parser.parse('<|python_tag|>brave_search.call(query="x")').errors[0]).toMatch(/expected a JSON object/);
    expect(parser.parse('{"name": "python", "parameters": {"code": "x"}} and then').errors[0]).toMatch(/tool call 2/);
    expect(parser.parse('{"name": "python", "parameters": [1]}').errors[0]).toMatch(/"parameters" must be a JSON object/);
    expect(parser.parse('<|python_tag|>').errors).toHaveLength(1);
  });

  it('writes the Llama 3.1 form', () => {
    expect(parser.format([{ name: 'python', arguments: { code: 'print(1)' } }])).toBe('{"name": "python", "parameters": {"code": "print(1)"}}');
  });
});
