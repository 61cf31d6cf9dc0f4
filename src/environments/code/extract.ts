import type { EpisodeOutcome } from '../types.js';

/**
 * Finding the program the model submitted. The convention the code environment's prompt asks for: the solution
 * in a ```python fenced block of the final reply, or passed to the `finish` tool. Indentation inside the block
 * is kept as written (a HumanEval completion may be an indented function body).
 */

/** Where the solution came from. */
export type SolutionSource = 'finish_tool' | 'code_block';

/** Languages a fenced block may be tagged with and still be taken as Python; untagged blocks count too. */
const PYTHON_TAGS = new Set(['', 'python', 'python3', 'py', 'py3']);

/**
 * The content of the last complete fenced code block tagged as Python (or untagged) in `text`, without its fences;
 * undefined when there is none. Fences are CommonMark's: a line of three or more backticks or tildes, closed by a
 * line of at least as many of the same character. An unclosed block (the model ran out of tokens mid-program)
 * does not count. One pass over the lines.
 */
export function lastPythonBlock(text: string): string | undefined {
  const lines = text.split('\n');
  let found: string | undefined;
  let open: { fence: string; tag: string; from: number } | undefined;
  for (let i = 0; i < lines.length; i++) {
    const fenced = fenceOf(lines[i]!);
    if (!fenced) continue;
    const { fence, tag } = fenced;
    if (!open) {
      open = { fence, tag: tag.toLowerCase(), from: i + 1 };
    } else if (fence[0] === open.fence[0] && fence.length >= open.fence.length && lines[i]!.trim() === fence) {
      if (PYTHON_TAGS.has(open.tag)) found = lines.slice(open.from, i).join('\n');
      open = undefined;
    }
  }
  return found;
}

/**
 * The submitted program: the finish tool's answer when it was called with non-blank code (its last Python block
 * when it holds one, else the whole answer), else the last Python block of the last assistant message.
 */
export function findSolution(outcome: Pick<EpisodeOutcome, 'messages' | 'finishAnswer'>): { code: string; source: SolutionSource } | undefined {
  const submitted = outcome.finishAnswer;
  if (submitted !== undefined && submitted.trim() !== '') {
    const block = lastPythonBlock(submitted);
    return { code: block ?? submitted, source: 'finish_tool' };
  }
  const last = outcome.messages.findLast((m) => m.role === 'assistant');
  const block = last === undefined ? undefined : lastPythonBlock(last.content);
  return block !== undefined && block.trim() !== '' ? { code: block, source: 'code_block' } : undefined;
}

/**
 * A fence line: up to three spaces or tabs, three or more backticks or tildes, then an info string without
 * backticks whose first word is the tag. Read in one pass: the regular expression this replaces
 * (`[ \t]*([^\s`]*)[^`]*$` after the fence) backtracked quadratically on a long line ending in a backtick, and
 * lines of model output run to 100K characters (a 64K-character line took 2 s of the event loop).
 */
function fenceOf(line: string): { fence: string; tag: string } | undefined {
  const m = /^[ \t]{0,3}(`{3,}|~{3,})(.*)$/s.exec(line);
  if (!m) return undefined;
  const [, fence = '', rest = ''] = m;
  if (rest.includes('`')) return undefined;
  const info = rest.replace(/^[ \t]+/, '');
  return { fence, tag: /^[^\s`]*/.exec(info)![0] };
}
