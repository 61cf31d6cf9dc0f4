import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { findSolution, lastPythonBlock } from '../../../src/environments/code/extract.js';
import { judgeOutput } from '../../../src/environments/code/judge.js';

describe('finding the submitted program', () => {
  it('takes the last complete python (or untagged) block, indentation kept', () => {
    const text = 'First try:\n```python\nx = 1\n```\nBetter:\n```py\n    return a + b\n```\nAnd a shell note:\n```bash\nls\n```\n';
    expect(lastPythonBlock(text)).toBe('    return a + b');
    expect(lastPythonBlock('```\nprint(1)\n```')).toBe('print(1)');
    expect(lastPythonBlock('~~~python\nprint(2)\n~~~')).toBe('print(2)');
  });

  it('ignores an unclosed block and fences inside longer fences', () => {
    expect(lastPythonBlock('```python\nok = 1\n```\n```python\ncut off mid-progr')).toBe('ok = 1');
    expect(lastPythonBlock('````python\ns = """\n```\n"""\n````')).toBe('s = """\n```\n"""');
  });

  it('prefers the finish tool (its block, or the whole answer) over the reply', () => {
    const messages = [{ role: 'assistant' as const, content: '```python\nfrom_reply = 1\n```' }];
    expect(findSolution({ messages, finishAnswer: '```python\nfrom_finish = 1\n```' })).toEqual({ code: 'from_finish = 1', source: 'finish_tool' });
    expect(findSolution({ messages, finishAnswer: 'def f():\n    return 1' })).toEqual({ code: 'def f():\n    return 1', source: 'finish_tool' });
    expect(findSolution({ messages, finishAnswer: '  ' })).toEqual({ code: 'from_reply = 1', source: 'code_block' });
    expect(findSolution({ messages: [{ role: 'assistant', content: 'no code here' }] })).toBeUndefined();
  });
});

describe('judging stdout token by token', () => {
  it('ignores whitespace layout and nothing else', () => {
    expect(judgeOutput('1 2\r\n3  \n\n', '1\n2 3')).toEqual({ accepted: true });
    expect(judgeOutput('', '  \n')).toEqual({ accepted: true });
    expect(judgeOutput('1 2 4', '1 2 3')).toEqual({ accepted: false, difference: 'token 3: expected "3", got "4"' });
    expect(judgeOutput('YES', 'yes').accepted).toBe(false);
    expect(judgeOutput('1.0', '1').accepted).toBe(false);
    expect(judgeOutput('1 2', '1 2 3').difference).toMatch(/ends after 2 tokens; expected 3/);
    expect(judgeOutput('1 2 3', '1 2').difference).toMatch(/extra: "3"/);
  });

  it('accepts any re-spacing of the expected tokens and rejects any changed token (property)', () => {
    const token = fc.stringMatching(/^[!-~]{1,6}$/);
    const space = fc.constantFrom(' ', '\n', '\t', '\r\n', '  ');
    fc.assert(
      fc.property(fc.array(fc.tuple(token, space), { minLength: 1, maxLength: 20 }), fc.nat(), (pairs, k) => {
        const expected = pairs.map(([t]) => t).join(' ');
        const respaced = pairs.map(([t, s]) => t + s).join('');
        expect(judgeOutput(respaced, expected).accepted).toBe(true);
        const changed = pairs.map(([t], i) => (i === k % pairs.length ? `${t}x` : t)).join('\n');
        expect(judgeOutput(changed, expected).accepted).toBe(false);
      }),
    );
  });
});
