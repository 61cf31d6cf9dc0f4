import { LRUCache } from 'lru-cache';
import { RolloutError } from '../errors.js';
import { toolsKey } from './tools-key.js';
import type { ChatMessage, ChatTemplate, ToolSchema } from './types.js';

/**
 * Stand-ins for message contents; no template prints these itself and none contains whitespace to trim. They are
 * written with a private-use character of plane 15, which environment contents never hold once escaped
 * (opaque-content.ts), so a tool that prints a probe cannot move the anchor and cut the template's own text (the
 * closing of the assistant turn, the tool header) out of its observation.
 */
const PROBE_USER = '\u{FFFFC}probe-user-3f9a\u{FFFFC}';
export const PROBE_ASSISTANT = '\u{FFFFC}probe-assistant-3f9a\u{FFFFC}';

/**
 * How {@link environmentDelta} found the text between turns, tried in this order:
 * - `anchor`: the last assistant content is replaced by a marker and the delta is everything rendered after that
 *   marker, checked to end the real render. Works whether or not the template renders the last assistant message
 *   differently when it is last, or rewrites earlier turns (as Qwen3 does with its <think> blocks).
 * - `prefix`: the template rewrites the content itself (the marker is not found), but render(history) is a prefix
 *   of render(history + new messages): the delta is the difference.
 * - `isolated`: neither worked; only the new messages are rendered, on their own, without tools — kept only when the
 *   whole render ends with the probed closing and that text (a render on its own may open with <bos> or a default
 *   system block); otherwise environmentDelta refuses (`failed_precondition`) rather than append tokens no render of
 *   the conversation holds.
 */
export type DeltaMethod = 'prefix' | 'anchor' | 'isolated';

/**
 * The text a template writes after an assistant message's content to close the turn (ChatML: "<|im_end|>\n"),
 * found by rendering a probe conversation, so no model's format is hard-coded. Empty when the template writes
 * nothing after the content, or when the probe content cannot be found in the render.
 */
export function probeAssistantClosing(template: ChatTemplate, tools: readonly ToolSchema[] | undefined): string {
  // Depends only on the template and the tools: cached, since every trajectory asks.
  let byTools = closingCache.get(template);
  if (!byTools) closingCache.set(template, (byTools = new LRUCache({ max: MAX_PROBED_TOOL_LISTS })));
  const key = tools ? `t${toolsKey(tools)}` : '';
  let closing = byTools.get(key);
  if (closing === undefined) {
    closing = renderProbeClosing(template, tools);
    byTools.set(key, closing);
  }
  return closing;
}

const closingCache = new WeakMap<ChatTemplate, LRUCache<string, string>>();

/**
 * Tool lists the per-template probe caches keep (here and in suffix-delta.ts), least recently used out first. Keys
 * are small whatever the schemas (tools-key.ts), so this bounds their memory; past it a list is probed again when it
 * comes back, instead of on every turn as when a full cache refused new lists.
 */
export const MAX_PROBED_TOOL_LISTS = 256;

function renderProbeClosing(template: ChatTemplate, tools: readonly ToolSchema[] | undefined): string {
  const probe: ChatMessage[] = [
    { role: 'user', content: PROBE_USER },
    { role: 'assistant', content: PROBE_ASSISTANT },
  ];
  const text = template.render(probe, withTools({ addGenerationPrompt: false }, tools));
  const at = text.lastIndexOf(PROBE_ASSISTANT);
  return at < 0 ? '' : text.slice(at + PROBE_ASSISTANT.length);
}

/** Input of {@link environmentDelta}. */
export interface DeltaRequest {
  /** The conversation so far; its last message is the assistant turn the model just sampled. */
  history: readonly ChatMessage[];
  /** The environment's messages (tool results, user follow-ups) to add after it, contents escaped (escapeMessage). */
  added: readonly ChatMessage[];
  tools: readonly ToolSchema[] | undefined;
  /** From {@link probeAssistantClosing}. */
  closing: string;
}

/** The template text to append after an assistant turn: its closing, the new messages, the generation prompt. */
export interface Delta {
  /** Starts with the full closing of the assistant turn; the caller removes what the model sampled itself. */
  text: string;
  method: DeltaMethod;
}

/**
 * "Render the conversation, tokenize the delta": the text the template writes after the last assistant
 * content up to and including the next generation prompt. Sampled tokens are never re-rendered or
 * re-tokenized; only this text is, so the record stays exactly what the model saw and sampled.
 *
 * The delta always describes the new messages as the template renders them in context; what `method` says is
 * only how the boundary was located (see {@link DeltaMethod}).
 */
export function environmentDelta(template: ChatTemplate, request: DeltaRequest): Delta {
  const { history, added, tools, closing } = request;
  const last = history.at(-1);
  if (last?.role !== 'assistant') {
    throw new RolloutError('failed_precondition', 'environment messages must follow an assistant turn');
  }
  const full = template.render([...history, ...added], withTools({ addGenerationPrompt: true }, tools));
  // Anchor first: it is Qwen3's normal path (see DeltaMethod) and, checked against `full`, as exact as the prefix
  // diff; trying it first saves one whole-conversation render per environment turn on such templates.
  const anchor = anchorFor([...history, ...added]);
  const anchored = [...history.slice(0, -1), { ...last, content: anchor }, ...added];
  const marked = template.render(anchored, withTools({ addGenerationPrompt: true }, tools));
  const at = marked.lastIndexOf(anchor);
  // Unique, or the anchor could be a copy in content (callers pass escaped contents, which cannot hold one).
  if (at >= 0 && marked.indexOf(anchor) === at) {
    const tail = marked.slice(at + anchor.length);
    if (full.endsWith(tail)) return { text: tail, method: 'anchor' };
  }
  const base = template.render(history, withTools({ addGenerationPrompt: false }, tools));
  if (full.startsWith(base) && base.endsWith(closing)) {
    return { text: closing + full.slice(base.length), method: 'prefix' };
  }
  // Last resort, checked against the whole render: the new messages rendered on their own are a conversation's opening
  // (<bos>, a default system block: Gemma, Llama 3.x), which mid-trajectory would be tokens no uninterrupted render
  // holds. Kept only when the whole render ends with exactly the (probed, non-empty) closing and them — the tail of the
  // whole render after the assistant content, then; otherwise refused (no shipped family gets here:
  // test/tokens/review-s36-isolated-delta.test.ts).
  const alone = template.render(added, { addGenerationPrompt: true });
  if (closing !== '' && full.endsWith(closing + alone)) return { text: closing + alone, method: 'isolated' };
  const message =
    'the chat template cannot be diffed between turns: neither the assistant content (anchor) nor the conversation before the new messages (prefix) can be found in its render, and the new messages rendered alone are not how the whole render ends';
  throw new RolloutError('failed_precondition', message, { cause: new UndiffableTemplate(message) });
}

/**
 * The anchor marker for a conversation: PROBE_ASSISTANT, unless a content holds it — environment contents are escaped
 * and cannot, but earlier assistant contents are the policy's text as sampled, and a model that wrote the marker
 * would make every later anchor ambiguous (a fallback, or a refusal, chosen by the policy). Then the marker is written
 * with a private-use character no content holds (one pass over the contents, whatever they hold).
 */
function anchorFor(messages: readonly ChatMessage[]): string {
  if (!messages.some((m) => m.content.includes(PROBE_ASSISTANT))) return PROBE_ASSISTANT;
  const used = new Set<number>();
  for (const m of messages) {
    for (const ch of m.content) {
      const c = ch.codePointAt(0)!;
      if (c >= 0xf0000) used.add(c);
    }
  }
  let c = 0xf0000;
  while (used.has(c) && c < 0x10fffd) c++;
  const mark = String.fromCodePoint(c);
  return `${mark}probe-assistant-3f9a${mark}`;
}

/** Why environmentDelta refused: no way to find the text between turns that the whole render vouches for. */
class UndiffableTemplate extends Error {}

/**
 * Whether `err` is environmentDelta's refusal of a conversation it cannot diff (not a shape the template refuses):
 * suffix-delta.ts's probe then calls the template not local, as it did when such a delta came back `isolated`.
 */
export function isUndiffable(err: unknown): boolean {
  return err instanceof RolloutError && err.cause instanceof UndiffableTemplate;
}

function withTools(
  options: { addGenerationPrompt: boolean },
  tools: readonly ToolSchema[] | undefined,
): { addGenerationPrompt: boolean; tools?: readonly ToolSchema[] } {
  return tools === undefined ? options : { ...options, tools };
}
