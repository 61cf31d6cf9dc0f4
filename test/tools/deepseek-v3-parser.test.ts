import { describe, expect, it } from 'vitest';
import { DeepSeekV3ToolCallParser } from '../../src/tools/deepseek-v3-parser.js';

const parser = new DeepSeekV3ToolCallParser();
const call = (name: string, json: string): string => `<｜tool▁call▁begin｜>function<｜tool▁sep｜>${name}\n\`\`\`json\n${json}\n\`\`\`<｜tool▁call▁end｜>`;

describe('DeepSeekV3ToolCallParser (the DeepSeek-V3 template form, as vLLM deepseek_v3 reads it)', () => {
  it('parses the calls of a calls block, after any content', () => {
    const text = `Let me run it.<｜tool▁calls▁begin｜>${call('python', '{"code": "print(1)"}')}\n${call('finish', '{"answer": "1"}')}<｜tool▁calls▁end｜>`;
    expect(parser.parse(text)).toEqual({
      calls: [
        { name: 'python', arguments: { code: 'print(1)' } },
        { name: 'finish', arguments: { answer: '1' } },
      ],
      errors: [],
    });
  });

  it('has no calls without <｜tool▁calls▁begin｜>, even if a call body appears', () => {
    expect(parser.parse(`The answer is 5. ${call('python', '{}')}`)).toEqual({ calls: [], errors: [] });
  });

  it('tolerates a calls block cut before <｜tool▁calls▁end｜>', () => {
    expect(parser.parse(`<｜tool▁calls▁begin｜>${call('python', '{"code": "1"}')}`).calls).toEqual([{ name: 'python', arguments: { code: '1' } }]);
  });

  it('reports unclosed calls, bad JSON, missing fences and other call types by position', () => {
    const errors = parser.parse(
      `<｜tool▁calls▁begin｜>${call('a', '{bad')}${call('b', '[1]')}<｜tool▁call▁begin｜>retrieval<｜tool▁sep｜>c\n\`\`\`json\n{}\n\`\`\`<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>d {}<｜tool▁call▁end｜><｜tool▁call▁begin｜>function`,
    ).errors;
    expect(errors).toHaveLength(5);
    expect(errors[0]).toMatch(/^tool call 1: a: invalid JSON/);
    expect(errors[1]).toMatch(/^tool call 2: b: "arguments" must be a JSON object/);
    expect(errors[2]).toMatch(/^tool call 3: unknown call type "retrieval"/);
    expect(errors[3]).toMatch(/^tool call 4: expected function/);
    expect(errors[4]).toMatch(/^tool call 5: .* is not closed/);
    expect(parser.parse('<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>').errors).toHaveLength(1);
  });
});
