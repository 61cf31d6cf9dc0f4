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
 * - `isolated`: neither worked; only the new messages are rendered, on their own, without tools.
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
  const anchored = [...history.slice(0, -1), { ...last, content: PROBE_ASSISTANT }, ...added];
  const marked = template.render(anchored, withTools({ addGenerationPrompt: true }, tools));
  const at = marked.lastIndexOf(PROBE_ASSISTANT);
  // Unique, or the anchor could be a copy in content (callers pass escaped contents, which cannot hold one).
  if (at >= 0 && marked.indexOf(PROBE_ASSISTANT) === at) {
    const tail = marked.slice(at + PROBE_ASSISTANT.length);
    if (full.endsWith(tail)) return { text: tail, method: 'anchor' };
  }
  const base = template.render(history, withTools({ addGenerationPrompt: false }, tools));
  if (full.startsWith(base) && base.endsWith(closing)) {
    return { text: closing + full.slice(base.length), method: 'prefix' };
  }
  const alone = template.render(added, { addGenerationPrompt: true });
  return { text: closing + alone, method: 'isolated' };
}

function withTools(
  options: { addGenerationPrompt: boolean },
  tools: readonly ToolSchema[] | undefined,
): { addGenerationPrompt: boolean; tools?: readonly ToolSchema[] } {
  return tools === undefined ? options : { ...options, tools };
}
