import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { findSolution, lastPythonBlock } from '../../../src/environments/code/extract.js';
import { judgeOutput } from '../../../src/environments/code/judge.js';
import { codePrompt } from '../../../src/environments/code/code-environment.js';
import type { CodeInstance } from '../../../src/environments/code/instance.js';

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

  it('compares decimal numbers within a float tolerance when the task gives one, and text as text', () => {
    const both = { absolute: 1e-6, relative: 1e-6 };
    expect(judgeOutput('0.3333333333', '0.333333', both)).toEqual({ accepted: true });
    expect(judgeOutput('1', '1.0000001', both).accepted).toBe(true);
    expect(judgeOutput('1e9', '1000000500', both).accepted).toBe(true); // relative: 5e-7
    expect(judgeOutput('0.33', '0.333333', both)).toEqual({ accepted: false, difference: 'token 1: expected "0.333333", got "0.33" (outside the tolerance)' });
    expect(judgeOutput('nan', '0.5', both).difference).toContain('(not a number)');
    for (const junk of ['inf', '0x1p-1', '1/2', '.5.']) expect(judgeOutput(junk, '0.5', { absolute: 10 }).accepted, junk).toBe(false);
    // Absolute only: a large number needs the absolute error; relative only: a small one needs the relative error.
    expect(judgeOutput('1000000.5', '1000000', { absolute: 1e-6 }).accepted).toBe(false);
    expect(judgeOutput('0.0000015', '0.000001', { relative: 1e-6 }).accepted).toBe(false);
    expect(judgeOutput('0.0000015', '0.000001', { absolute: 1e-6 }).accepted).toBe(true);
    // Words stay exact, and without a tolerance numbers are text.
    expect(judgeOutput('Yes 0.5000001', 'YES 0.5', both).accepted).toBe(false);
    expect(judgeOutput('YES 0.5000001', 'YES 0.5', both).accepted).toBe(true);
    expect(judgeOutput('0.5000001', '0.5').accepted).toBe(false);
  });

  it('accepts a number within either tolerance and rejects one beyond both (property)', () => {
    fc.assert(
      fc.property(
        fc.double({ min: -1e9, max: 1e9, noNaN: true }),
        fc.constantFrom(1e-9, 1e-6, 1e-3),
        fc.constantFrom(1e-9, 1e-6, 1e-3),
        fc.double({ min: 0, max: 0.99, noNaN: true }),
        fc.boolean(),
        (expected, absolute, relative, frac, above) => {
          const allowed = Math.max(absolute, relative * Math.abs(expected));
          const sign = above ? 1 : -1;
          const inside = expected + sign * allowed * frac;
          const outside = expected + sign * allowed * 1.01 + sign * Math.abs(expected) * 1e-12 + sign * 1e-12;
          const tolerance = { absolute, relative };
          expect(judgeOutput(String(inside), String(expected), tolerance).accepted).toBe(true);
          expect(judgeOutput(String(outside), String(expected), tolerance).accepted).toBe(false);
          expect(judgeOutput(`x ${String(inside)}`, `x ${String(expected)}`).accepted).toBe(inside === expected);
        },
      ),
    );
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

/** The regular expressions these replaced (they backtracked super-linearly on hostile text): the oracles. */
const OLD_FENCE = /^[ \t]{0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)[^`]*$/;
const OLD_DECIMAL = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/;

/** lastPythonBlock as it was, with the old fence expression: what the new reader must agree with. */
function oldLastPythonBlock(text: string): string | undefined {
  const lines = text.split('\n');
  let found: string | undefined;
  let open: { fence: string; tag: string; from: number } | undefined;
  for (let i = 0; i < lines.length; i++) {
    const m = OLD_FENCE.exec(lines[i]!);
    if (!m) continue;
    const [, fence = '', tag = ''] = m;
    if (!open) open = { fence, tag: tag.toLowerCase(), from: i + 1 };
    else if (fence[0] === open.fence[0] && fence.length >= open.fence.length && lines[i]!.trim() === fence) {
      if (['', 'python', 'python3', 'py', 'py3'].includes(open.tag)) found = lines.slice(open.from, i).join('\n');
      open = undefined;
    }
  }
  return found;
}

describe('hostile model output and program output, read in linear time', () => {
  it('finds code blocks exactly as the fence expression it replaced did (property)', () => {
    const piece = fc.constantFrom('```', '````', '~~~', '`', ' ', '\t', '\r', 'python', 'py', 'bash', 'x = 1', '\n');
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 16 }), (pieces) => {
        const text = pieces.join('');
        expect(lastPythonBlock(text)).toBe(oldLastPythonBlock(text));
      }),
      { numRuns: 5_000 },
    );
  });

  it('reads a 200K-character line ending in a backtick at once (the fence expression took seconds)', () => {
    const started = performance.now();
    expect(findSolution({ messages: [{ role: 'assistant', content: `\`\`\`${' '.repeat(200_000)}\`` }] })).toBeUndefined();
    expect(findSolution({ messages: [], finishAnswer: `\`\`\`${'='.repeat(200_000)}\`` })?.source).toBe('finish_tool');
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  it('tells decimal numbers exactly as the expression it replaced did, and reads a long digit run at once', () => {
    const piece = fc.constantFrom('1', '0', '9', '.', 'e', 'E', '+', '-', 'x');
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 10 }), (pieces) => {
        const token = pieces.join('');
        // Equal tokens are accepted either way; compare a number within tolerance of itself shifted.
        const accepted = judgeOutput(token, `${token} `, { absolute: 0 }).accepted;
        expect(accepted).toBe(true);
        const asNumber = judgeOutput(`${token}`, '0', { absolute: 1e300 }).accepted;
        const oldAsNumber = OLD_DECIMAL.test(token) && Number.isFinite(Number(token)) && token !== '' ;
        expect(asNumber).toBe(oldAsNumber || token === '0');
      }),
      { numRuns: 5_000 },
    );
    const started = performance.now();
    expect(judgeOutput(`${'1'.repeat(200_000)}x`, '1', { absolute: 0.5 }).accepted).toBe(false);
    expect(judgeOutput('1', `${'1'.repeat(200_000)}x`, { absolute: 0.5 }).accepted).toBe(false);
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  it('trims a prompt\'s trailing newlines by a scan, not a backtracking replace', () => {
    const task = { format: 'stdio', prompt: `${'\n'.repeat(500_000)}Read n.\n\n\n`, tests: [{ input: '1', output: '1' }], timeLimitS: 1, memoryLimitMb: 256 } as unknown as CodeInstance;
    const started = performance.now();
    const [, user] = codePrompt(task);
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(user!.content.startsWith(`${'\n'.repeat(500_000)}Read n.\n\nTime limit`)).toBe(true);
  });
});
