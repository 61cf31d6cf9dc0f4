import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { DeepSeekV3ToolCallParser } from '../../src/tools/deepseek-v3-parser.js';

const BEGIN = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>';
const END = '<｜tool▁call▁end｜><｜tool▁calls▁end｜>';
const SEP = '<｜tool▁sep｜>';
/** The regular expression the body reader replaced (it backtracked cubically on runs of spaces): the oracle. */
const ORACLE = /^\s*([^\n]*?)\s*<｜tool▁sep｜>\s*([^\n]*?)\s*\n\s*```(?:json)?\s*\n([\s\S]*?)\n?\s*```\s*$/;

const parser = new DeepSeekV3ToolCallParser();

/** What the parser made of one call body: a call's name and arguments, or that it refused it. */
function outcome(body: string): string {
  const { calls, errors } = parser.parse(`${BEGIN}${body}${END}`);
  return calls.length === 1 ? `call ${calls[0]!.name} ${JSON.stringify(calls[0]!.arguments)}` : `error ${errors.length}`;
}

/** The same through the oracle: matched (then the JSON and name decide) or refused. */
function oracle(body: string): string {
  const m = ORACLE.exec(body);
  if (!m) return 'error 1';
  const [, type, name, json] = m as unknown as [string, string, string, string];
  if (type !== 'function' || name === '') return 'error 1';
  try {
    const value: unknown = JSON.parse(json);
    if (typeof value !== 'object' || value === null || Array.isArray(value)) return outcome(body); // the arguments' own rules
    return `call ${name} ${JSON.stringify(value)}`;
  } catch {
    return 'error 1';
  }
}

describe('DeepSeek-V3 call body, read by hand', () => {
  it('accepts and refuses exactly what the regular expression it replaced did', () => {
    const piece = fc.constantFrom(' ', '\n', '\t', 'function', SEP, 'python', '```', 'json', '{"a": 1}', '{}', '[1]', 'x');
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 14 }), (pieces) => {
        const body = pieces.join('');
        expect(outcome(body)).toBe(oracle(body));
      }),
      { numRuns: 20_000 },
    );
    // And the canonical form, with the whitespace variations the template and models write.
    for (const body of ['function<｜tool▁sep｜>python\n```json\n{"code": "1"}\n```', '  function <｜tool▁sep｜> python \n\n```\n{"code": "1"}\n\n```  ']) {
      expect(outcome(body)).toBe('call python {"code":"1"}');
    }
  });

  it('reads a body of thousands of spaces at once (the regex took seconds: the event loop stalled)', () => {
    const started = performance.now();
    expect(outcome(`function${' '.repeat(20_000)}`)).toBe('error 1');
    expect(outcome(`function${SEP}${' '.repeat(20_000)}x`)).toBe('error 1');
    expect(performance.now() - started).toBeLessThan(200);
  });
});
