import { afterReasoning } from '../../tools/call-json.js';
import type { EpisodeOutcome } from '../types.js';

/**
 * Finding the final answer in a model's text. The convention the math environment's prompt asks for is
 * \boxed{answer}; answers routinely contain braces themselves (\boxed{\frac{1}{2}}, \boxed{\{1,2\}}), so the
 * argument is found by brace matching, not by a regex.
 */

const BOX_COMMANDS = ['\\boxed', '\\fbox'] as const;

function boxCommandAt(text: string, i: number): string | undefined {
  for (const cmd of BOX_COMMANDS) {
    if (text.startsWith(cmd, i) && !/[a-zA-Z]/.test(text[i + cmd.length] ?? '')) return cmd;
  }
  return undefined;
}

/**
 * The argument of the last complete \boxed{…} (or \fbox{…}) in `text`, trimmed; undefined when there is none.
 *
 * "Last" means the one that starts last, so in "\boxed{1} … \boxed{2}" it is "2". Nested braces and escaped
 * braces (\{ \}) inside the argument are kept. An unclosed \boxed{ is skipped in favour of an earlier complete
 * one. The form "\boxed 5" (a single token, no braces) is accepted too. One linear pass, whatever the input.
 */
export function extractLastBoxed(text: string): string | undefined {
  // Stack of open braces: for each, the index where a \boxed argument starts, or -1 for an ordinary brace.
  const stack: number[] = [];
  let best: { start: number; value: string } | undefined;
  const consider = (start: number, value: string): void => {
    if (!best || start > best.start) best = { start, value: value.trim() };
  };
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '\\') {
      const cmd = boxCommandAt(text, i);
      if (cmd === undefined) {
        i++; // skip the escaped character, so \{ and \} never count as braces
        continue;
      }
      let j = i + cmd.length;
      while (j < text.length && (text[j] === ' ' || text[j] === '\t')) j++;
      if (text[j] === '{') {
        stack.push(j + 1);
        i = j;
      } else if (j > i + cmd.length) {
        const m = /^[^\s$]+/.exec(text.slice(j, j + 200));
        if (m) consider(j, m[0]);
        i = j - 1;
      } else {
        i += cmd.length - 1;
      }
      continue;
    }
    if (c === '{') stack.push(-1);
    else if (c === '}' && stack.length > 0) {
      const start = stack.pop()!;
      if (start >= 0) consider(start, text.slice(start, i));
    }
  }
  return best?.value;
}

/** "\boxed{x}" → "x" when the whole (trimmed) string is one box; anything else is returned unchanged. */
export function unwrapBoxed(s: string): string {
  const t = s.trim();
  const cmd = boxCommandAt(t, 0);
  if (cmd === undefined) return s;
  let j = cmd.length;
  while (t[j] === ' ') j++;
  if (t[j] !== '{' || !t.endsWith('}')) return s;
  let depth = 0;
  for (let i = j; i < t.length; i++) {
    const c = t[i];
    if (c === '\\') i++;
    else if (c === '{') depth++;
    else if (c === '}' && --depth === 0) return i === t.length - 1 ? t.slice(j + 1, i).trim() : s;
  }
  return s;
}

/** Where the final answer came from: the finish tool, a \boxed{} in the last assistant message, or nowhere. */
export type AnswerSource = 'finish_tool' | 'boxed' | 'none';

/**
 * What an assistant message says after its reasoning: the answer is looked for there only. A reasoning model
 * (Qwen3, DeepSeek-R1) drafts in `<think>…</think>`, boxed candidates and "the answer is A?" included; graded, a
 * draft stood for the answer whenever the reply after it had none, and a message cut inside its reasoning (the token
 * budget ran out) was rewarded for its last draft. The block is what the tool-call parsers skip
 * (tools/call-json.ts `afterReasoning`): one the message opens with, ended by the first `</think>`, or, when the
 * template opened it in the prompt, everything up to the first `</think>`; an unclosed one leaves nothing.
 */
export function finalReply(content: string): string {
  return afterReasoning(content, () => -1);
}

/**
 * The model's final answer: the finish tool's answer when it was called with a non-blank one (an explicit
 * submission beats anything written before it), else the last \boxed{…} of the last assistant message's reply (after
 * its reasoning: {@link finalReply}).
 */
export function findFinalAnswer(outcome: Pick<EpisodeOutcome, 'messages' | 'finishAnswer'>): { answer: string; source: AnswerSource } | undefined {
  const submitted = outcome.finishAnswer?.trim();
  if (submitted) return { answer: submitted, source: 'finish_tool' };
  const last = outcome.messages.findLast((m) => m.role === 'assistant');
  const boxed = last === undefined ? undefined : extractLastBoxed(finalReply(last.content));
  return boxed ? { answer: boxed, source: 'boxed' } : undefined;
}
