import { describe, expect, it } from 'vitest';
import { HermesToolCallParser } from '../../src/tools/hermes-parser.js';
import { Llama3JsonToolCallParser } from '../../src/tools/llama3-json-parser.js';
import { DeepSeekV3ToolCallParser } from '../../src/tools/deepseek-v3-parser.js';

const hermes = new HermesToolCallParser();
const llama = new Llama3JsonToolCallParser();
const deepseek = new DeepSeekV3ToolCallParser();

// Regression (tokens review, 2026-12-02): every parser kept only the text after the LAST `</think>` and read nothing when
// `<think>` appeared anywhere, so a call whose arguments mention a reasoning tag (code that handles them) was hidden or
// cut in half, and the agent loop took the message for a plain answer: COMPLETED, the tool never run. And the Hermes
// parser closed a call at the first `</tool_call>`, even inside one of its JSON strings.
describe('reasoning markers inside a tool call\'s JSON arguments', () => {
  it('hermes: a call whose argument string holds "<think>" (no reasoning block at all) is still a call', () => {
    const code = "print(s.replace('<think>', ''))";
    const msg = `I will strip the tags.\n<tool_call>\n{"name": "python", "arguments": {"code": ${JSON.stringify(code)}}}\n</tool_call>`;
    expect(hermes.parse(msg)).toEqual({ calls: [{ name: 'python', arguments: { code } }], errors: [] });
  });

  it('hermes: a call whose argument string holds "</think>" after a real reasoning block is still a call', () => {
    const code = "answer = text.split('</think>')[-1]";
    const msg = `<think>\nplan\n</think>\n\n<tool_call>\n{"name": "python", "arguments": {"code": ${JSON.stringify(code)}}}\n</tool_call>`;
    expect(hermes.parse(msg)).toEqual({ calls: [{ name: 'python', arguments: { code } }], errors: [] });
  });

  it('llama3_json: a call whose parameters hold "</think>" is still a call', () => {
    const code = "answer = text.split('</think>')[-1]";
    const msg = `{"name": "python", "parameters": {"code": ${JSON.stringify(code)}}}`;
    expect(llama.parse(msg)).toEqual({ calls: [{ name: 'python', arguments: { code } }], errors: [] });
  });

  it('deepseek_v3: a call whose arguments hold "<think>" is still a call', () => {
    const args = { pattern: '<think>' };
    const msg = deepseek.format([{ name: 'grep', arguments: args }]);
    expect(deepseek.parse(msg)).toEqual({ calls: [{ name: 'grep', arguments: args }], errors: [] });
  });
});

describe('end marker inside a JSON string', () => {
  it('hermes: a call whose argument string contains "</tool_call>" is parsed as one call', () => {
    const content = 'OPEN = "<tool_call>"\nCLOSE = "</tool_call>"\n';
    const msg = `<tool_call>\n{"name": "str_replace_editor", "arguments": {"command": "create", "path": "p.py", "file_text": ${JSON.stringify(content)}}}\n</tool_call>`;
    expect(hermes.parse(msg)).toEqual({
      calls: [{ name: 'str_replace_editor', arguments: { command: 'create', path: 'p.py', file_text: content } }],
      errors: [],
    });
  });
});

describe('what still counts as reasoning', () => {
  it('a reasoning block the message opens with hides the calls drafted in it; the call after it is read', () => {
    const draft = '<tool_call>\n{"name": "python", "arguments": {"code": "draft"}}\n</tool_call>';
    const real = '<tool_call>\n{"name": "python", "arguments": {"code": "real"}}\n</tool_call>';
    expect(hermes.parse(`<think>\nmaybe ${draft}\n</think>\n\n${real}`)).toEqual({ calls: [{ name: 'python', arguments: { code: 'real' } }], errors: [] });
    // Cut inside its reasoning (a length stop): no call, not the draft.
    expect(hermes.parse(`<think>\nmaybe ${draft}`)).toEqual({ calls: [], errors: [] });
  });

  it('reasoning the template opened in the prompt (no <think> in the message) ends at its first </think> before a call', () => {
    const real = '<tool_call>\n{"name": "python", "arguments": {"code": "real"}}\n</tool_call>';
    expect(hermes.parse(`I should run it.\n</think>\n\n${real}`)).toEqual({ calls: [{ name: 'python', arguments: { code: 'real' } }], errors: [] });
    const call = '{"name": "python", "parameters": {"code": "x"}}';
    expect(llama.parse(`thinking...</think>${call}`)).toEqual({ calls: [{ name: 'python', arguments: { code: 'x' } }], errors: [] });
  });
});
