import { describe, expect, it } from 'vitest';
import { finalReply } from '../../src/environments/math/extract.js';
import { DeepSeekV3ToolCallParser } from '../../src/tools/deepseek-v3-parser.js';
import { HermesToolCallParser } from '../../src/tools/hermes-parser.js';
import { Llama3JsonToolCallParser } from '../../src/tools/llama3-json-parser.js';

const hermes = new HermesToolCallParser();
const llama = new Llama3JsonToolCallParser();
const deepseek = new DeepSeekV3ToolCallParser();

// Regression (review s44): a model whose template opens <think> in the generation prompt (Qwen3-Thinking-2507, the
// DeepSeek-R1 family) writes no <think> of its own. A call it drafted in that reasoning, before its first </think>,
// was run: the parsers took any </think> after a call for content. The answer extraction (math/extract.ts finalReply)
// reads the same message as reasoning up to that </think>, so the two disagreed on what the policy said, and a draft the
// model rejected in its reasoning ran in its sandbox. Only a </think> inside a call's own arguments is content.
describe('reasoning the template opened: calls drafted before its </think>', () => {
  const draft = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "rm -rf /work"}}\n</tool_call>';

  it('hermes: a drafted call is not run, as finalReply does not read it; the call after </think> is', () => {
    const msg = `I could run ${draft} but that is unsafe.\n</think>\n\nThe answer is \\boxed{4}.`;
    expect(finalReply(msg)).toBe('\n\nThe answer is \\boxed{4}.');
    expect(hermes.parse(msg)).toEqual({ calls: [], errors: [] });
    const real = '<tool_call>\n{"name": "python", "arguments": {"code": "print(4)"}}\n</tool_call>';
    expect(hermes.parse(`Maybe ${draft}? No.\n</think>\n\n${real}`)).toEqual({ calls: [{ name: 'python', arguments: { code: 'print(4)' } }], errors: [] });
     // A tag only mentioned in that reasoning is no call either (it was read as an unclosed one, an error observation).
    expect(hermes.parse(`I will wrap it in a <tool_call> tag.\n</think>\n\n${real}`)).toEqual({ calls: [{ name: 'python', arguments: { code: 'print(4)' } }], errors: [] });
  });

  it('hermes: a </think> inside a call\'s arguments (no reasoning at all) is still content', () => {
    const code = "x = s.split('</think>')[-1]";
    const msg = `Splitting.\n<tool_call>\n{"name": "python", "arguments": {"code": ${JSON.stringify(code)}}}\n</tool_call>`;
    expect(hermes.parse(msg)).toEqual({ calls: [{ name: 'python', arguments: { code } }], errors: [] });
    // Also after an earlier call of the same message, and with the open tag itself inside the string.
    const two = `${msg.slice('Splitting.\n'.length)}\n<tool_call>\n{"name": "python", "arguments": {"code": "t = '<tool_call>' + '</think>'"}}\n</tool_call>`;
    expect(hermes.parse(two).calls).toHaveLength(2);
  });

  it('llama3_json: a call object written before the reasoning ends is a draft; one holding </think> in its parameters is a call', () => {
    expect(llama.parse('{"name": "bash", "parameters": {"cmd": "ls"}} would list it.\n</think>\n\nDone.')).toEqual({ calls: [], errors: [] });
    const code = "x = s.split('</think>')[-1]";
    const a = `{"name": "python", "parameters": {"code": "1"}}; {"name": "python", "parameters": {"code": ${JSON.stringify(code)}}}`;
    expect(llama.parse(a).calls).toEqual([{ name: 'python', arguments: { code: '1' } }, { name: 'python', arguments: { code } }]);
  });

  it('deepseek_v3: a calls block closed before </think> is a draft; one holding </think> in its arguments is a call', () => {
    const block = deepseek.format([{ name: 'bash', arguments: { cmd: 'ls' } }]);
    expect(deepseek.parse(`maybe ${block} no.\n</think>\n\nDone.`)).toEqual({ calls: [], errors: [] });
    const held = deepseek.format([{ name: 'grep', arguments: { pattern: '</think>' } }]);
    expect(deepseek.parse(held)).toEqual({ calls: [{ name: 'grep', arguments: { pattern: '</think>' } }], errors: [] });
  });
});
