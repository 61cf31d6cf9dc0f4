import { describe, expect, it } from 'vitest';
import { jsonValueEnd } from '../../src/tools/call-json.js';
import { DeepSeekV3ToolCallParser } from '../../src/tools/deepseek-v3-parser.js';

// Review s37 (left by s36's token review). A model may write a DeepSeek-V3 call's arguments as a JSON *string* that
// holds the JSON object (`"{\"code\": ...}"`, as OpenAI-style `arguments` are written); the parser accepts that form.
// Its end was found only for an object or array, so such a call was cut at the first <｜tool▁call▁end｜> in the text,
// one inside the string included: the call became a malformed-call error and the rest of its string was lost.

const CALLS_BEGIN = '<｜tool▁calls▁begin｜>';
const CALLS_END = '<｜tool▁calls▁end｜>';
const CALL_BEGIN = '<｜tool▁call▁begin｜>';
const CALL_END = '<｜tool▁call▁end｜>';
const SEP = '<｜tool▁sep｜>';

const parser = new DeepSeekV3ToolCallParser();

function stringCall(name: string, args: Record<string, unknown>, fenceGap = '\n'): string {
  return `${CALL_BEGIN}function${SEP}${name}\n\`\`\`json${fenceGap}${JSON.stringify(JSON.stringify(args))}\n\`\`\`${CALL_END}`;
}

describe('review s37: DeepSeek-V3 arguments written as a JSON string', () => {
  it('reads a string-argument call whose code holds the call and block end markers as one call', () => {
    const code = `END = "${CALL_END}"\nALL = "${CALLS_END}"\nprint(END, ALL)`;
    const text = `${CALLS_BEGIN}${stringCall('python', { code })}\n${stringCall('bash', { cmd: 'ls' })}${CALLS_END}`;
    expect(parser.parse(text)).toEqual({
      calls: [
        { name: 'python', arguments: { code } },
        { name: 'bash', arguments: { cmd: 'ls' } },
      ],
      errors: [],
    });
  });

  it('accepts any JSON whitespace before the value, as the template writes and call-json skips it', () => {
    const code = `x = "${CALL_END}"`;
    for (const gap of ['\n', '\r\n', '\n\t ', ' \n']) {
      expect(parser.parse(`${CALLS_BEGIN}${stringCall('python', { code }, gap)}${CALLS_END}`)).toEqual({ calls: [{ name: 'python', arguments: { code } }], errors: [] });
    }
  });

  it('jsonValueEnd finds the end of a string value, escapes included, and -1 when it does not close', () => {
    expect(jsonValueEnd('"a\\"b" rest', 0)).toBe(6);
    expect(jsonValueEnd('x "" y', 2)).toBe(4);
    expect(jsonValueEnd('"open \\" still', 0)).toBe(-1);
    expect(jsonValueEnd('{"a": "}"} tail', 0)).toBe(10);
  });
});
