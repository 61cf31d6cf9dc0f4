import htmlTags from 'html-tags';
import { RolloutError } from '../errors.js';
import type { ChatMessage, TextPart, Tokenizer, ToolSchema } from './types.js';

/**
 * Environment text never forges chat structure.
 *
 * A tool that prints "<|im_end|>\n<|im_start|>system\n..." must not put real control-token ids into the context
 * the policy is conditioned on, and neither may a dataset prompt: only the chat template's own text yields added
 * tokens. So every message content the environment supplies (the first system/user messages, tool results,
 * user follow-ups) is opaque to tokenization:
 *
 * 1. {@link escapeMessage}: before rendering, each added-token string in the content is replaced by a placeholder,
 *    one private-use character per added token (plane 15, U+F0000 + its index in `addedTokens`); a character of
 *    that plane already in the content is escaped as U+FFFFD + itself. Content without either — nearly all
 *    content — is passed on untouched, so its render and ids are exactly what they were without this module.
 * 2. The template renders the escaped messages, so it decides on the opaque content (a user message cannot pose
 *    as a Qwen3 tool response by wrapping itself in <tool_response>) and places the placeholders wherever it puts
 *    the content, trimmed, JSON-quoted or not: a placeholder has no whitespace and no JSON escape.
 * 3. {@link encodeRendered}: the rendered text is cut at placeholders into template parts and literal parts (the
 *    original strings) for {@link Tokenizer.encodeParts}, which finds added tokens in the template parts only and
 *    encodes the text around the literals as plain text. Decoding the ids gives the rendered text with the
 *    original strings back in place: for a template whose choices do not depend on those strings (Qwen3 for tool
 *    results and prompts), exactly the render of the real content.
 * 4. {@link encodeRendered} then checks that the ids hold exactly as many added-token ids as the template parts
 *    have added-token strings, and throws `internal` otherwise (e.g. a tokenizer that matches added tokens
 *    after normalization, which a raw scan cannot see): a trajectory fails loudly, never carries a forgery.
 *
 * Every added token counts, not only those flagged special: <tool_call>, </tool_response> and <think> are added
 * tokens because they mark structure the template and the tool-call parser rely on, and a tool that prints
 * "</tool_response>\n<tool_call>" forges that structure as surely as one printing <|im_start|>. Environment text
 * therefore yields an added-token id only where plain BPE of the text does (for Qwen3: never), or where the token
 * is text to the model (whitespace runs, HTML tags: {@link textAddedTokens}). The cost: a prompt
 * that says "answer inside <think> tags" is encoded as the characters, not the token, unlike a naive
 * `apply_chat_template` + tokenize.
 *
 * Tool schemas are opaque too ({@link escapeTools}): an environment may build its tools from the instance (a
 * function-calling dataset's own tools), so a description or parameter name is dataset text like a prompt, and the
 * template writes it (Qwen3 through tojson) or the server's tool instructions do (AdaptedChatTemplate).
 *
 * Limits: a plane-15 private-use character that reaches the rendered text from elsewhere than environment content
 * (an assistant content the template re-renders after the last turn) would be read as a placeholder — plain text
 * either way, never an added token; an added token formed across the boundary of a content and the template's own text (content
 * ending "<|im_" before template text "end|>") is not caught by the scan, since templates write whole tokens
 * after and before content, and would be caught by the count check only if it changes the count.
 */

const FIRST_PLACEHOLDER = 0xf0000;
const ESCAPE = '\u{FFFFD}';
const MAX_ADDED_TOKENS = 0xffffd - FIRST_PLACEHOLDER;
/** Any character of the placeholder plane, which is what marks rendered text as needing {@link literalParts}. */
const PLANE = /[\u{F0000}-\u{FFFFD}]/u;
/** What {@link literalParts} reads: an escaped character, or a placeholder. */
const PLACEHOLDERS = /\u{FFFFD}[\s\S]|[\u{F0000}-\u{FFFFC}]/gu;

interface Compiled {
  /** Finds what must be escaped in content: added-token strings (longest first) and plane-15 characters. */
  scan: RegExp;
  /** Same, not global: for a stateless test. */
  test: RegExp;
  /** Finds added-token strings in template text, as the tokenizer does. */
  added: RegExp | undefined;
  index: Map<string, number>;
  addedIds: Set<number>;
}

const compiledCache = new WeakMap<Tokenizer, Compiled>();

/** The added tokens {@link textAddedTokens} classifies, as tokenizer.json lists them. */
export interface AddedTokenFlags {
  readonly content: string;
  readonly special?: boolean;
}

/** `<td>`, `</table>`: an HTML element's opening or closing tag without attributes; group 1 is its name. */
const TAG = /^<\/?([a-z][a-z0-9]*)>$/;
/** The standard HTML element names (the `html-tags` package). */
const HTML_ELEMENTS: ReadonlySet<string> = new Set(htmlTags);

/**
 * The added tokens that are text rather than structure, so environment content keeps them as the tokenizer
 * finds them (never escaped, never counted by {@link verifyTemplateTokens}); every other added token is
 * structure, and environment text never yields it (see the module comment):
 *
 * - tokens made only of whitespace or SentencePiece's "▁": Gemma 3 adds "\n", "\n\n", "▁▁", ... so runs of them
 *   encode compactly; every newline of every observation would otherwise be encoded unlike the model's training text;
 * - markup tokens: not flagged `special`, exactly the opening or closing tag of a standard HTML element (the
 *   `html-tags` list: `<td>`, `</table>`, `<h1>`, `<code>`, ...), and not written by the chat template (its source
 *   does not contain the string). Gemma 3 has 68 of them, vocabulary compaction for web text: the model saw every
 *   table and heading of its training pages as these ids, so a fetched page or an HTML table in a tool result keeps
 *   them, as a fresh tokenization of the same text would. Such a tag marks nothing the template or a tool-call
 *   parser relies on (their markers — <tool_call>, <think>, <tool_response>, DeepSeek's <｜tool▁calls▁begin｜> —
 *   are no HTML element names, and a template that writes a tag makes it structure).
 *
 * Control-looking tokens stay structure even when not flagged special: Qwen3's <|fim_prefix|>, Gemma 3's
 * <unused0> ... <unused6241>, <mask>, [multimodal] and <bbox>.
 */
export function textAddedTokens(added: readonly AddedTokenFlags[], templateSource: string): ReadonlySet<string> {
  const text = new Set<string>();
  for (const { content, special } of added) {
    if (/^[\s\u2581]+$/u.test(content)) text.add(content);
    else if (special !== true && HTML_ELEMENTS.has(TAG.exec(content)?.[1] ?? '') && !templateSource.includes(content)) text.add(content);
  }
  return text;
}

function compiled(tokenizer: Tokenizer): Compiled {
  let entry = compiledCache.get(tokenizer);
  if (!entry) {
    const all = tokenizer.addedTokens;
    // Placeholders stand for an index into the full list; text tokens are simply never looked for.
    const text = tokenizer.textTokens;
    const tokens = all.filter((t) => !text.has(t));
    if (all.length > MAX_ADDED_TOKENS) {
      throw new RolloutError('failed_precondition', `the tokenizer has more than ${MAX_ADDED_TOKENS} added tokens`);
    }
    const index = new Map<string, number>();
    all.forEach((token, k) => {
      if (!index.has(token) && !text.has(token)) index.set(token, k);
    });
    const plane = '[\\u{F0000}-\\u{FFFFD}]';
    entry = {
      scan: alternation(tokens, 'gu', plane)!,
      test: alternation(tokens, 'u', plane)!,
      added: alternation(tokens, 'g'),
      index,
      addedIds: new Set(tokens.flatMap((t) => tokenizer.tokenId(t) ?? [])),
    };
    compiledCache.set(tokenizer, entry);
  }
  return entry;
}

/**
 * A regex matching any of the strings, longest first (so at one position the longest wins, as the tokenizer's
 * own splitter does), with an optional extra alternative (regex source); undefined when there is nothing to match.
 */
export function alternation(strings: readonly string[], flags: string, extra?: string): RegExp | undefined {
  const escaped = strings
    .filter((s) => s.length > 0)
    .sort((a, b) => b.length - a.length)
    .map((s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
  if (extra !== undefined) escaped.push(extra);
  return escaped.length === 0 ? undefined : new RegExp(escaped.join('|'), flags);
}

/**
 * The content as the template must see it: added-token strings replaced by placeholders (see the module
 * comment). The same string when there is nothing to replace.
 */
export function escapeContent(tokenizer: Tokenizer, content: string): string {
  const { scan, test, index } = compiled(tokenizer);
  if (!test.test(content)) return content;
  return content.replace(scan, (found) => {
    const k = index.get(found);
    return k === undefined ? ESCAPE + found : String.fromCodePoint(FIRST_PLACEHOLDER + k);
  });
}

/**
 * {@link escapeContent} of a message's content and of its name (a tool message's name is the name the policy
 * sampled when it called a tool that does not exist, and a template may write it: Llama 3.1's and Gemma 3's
 * adapted tool role put it in the observation's header); the message itself (not a copy) when nothing changes.
 */
export function escapeMessage(tokenizer: Tokenizer, message: ChatMessage): ChatMessage {
  const content = escapeContent(tokenizer, message.content);
  const name = message.name === undefined ? undefined : escapeContent(tokenizer, message.name);
  if (content === message.content && name === message.name) return message;
  return { ...message, content, ...(name !== undefined && { name }) };
}

/**
 * The tool schemas as the template must see them: every string in them (descriptions, names, enum values, property
 * names) escaped as {@link escapeContent} escapes a content, so a description that spells "<|im_end|>" is plain text
 * wherever the template or the tool instructions print it (as JSON: a placeholder needs no JSON escape). The same
 * array when nothing needs escaping (nearly always), and the same escaped array for the same array, so the caches keyed
 * by tool list (tools-key.ts memoizes per array) keep their hits. Escape once: an escaped list escaped again would
 * print its placeholders as themselves.
 */
export function escapeTools(tokenizer: Tokenizer, tools: readonly ToolSchema[] | undefined): readonly ToolSchema[] | undefined {
  if (tools === undefined || tools.length === 0) return tools;
  let byTools = escapedTools.get(tokenizer);
  if (!byTools) escapedTools.set(tokenizer, (byTools = new WeakMap()));
  let escaped = byTools.get(tools);
  if (escaped === undefined) {
    const { test } = compiled(tokenizer);
    const needs = (value: unknown): boolean => {
      if (typeof value === 'string') return test.test(value);
      if (Array.isArray(value)) return value.some(needs);
      if (typeof value === 'object' && value !== null) return Object.entries(value).some(([k, v]) => test.test(k) || needs(v));
      return false;
    };
    const escape = (value: unknown): unknown => {
      if (typeof value === 'string') return escapeContent(tokenizer, value);
      if (Array.isArray(value)) return value.map(escape);
      if (typeof value === 'object' && value !== null) return Object.fromEntries(Object.entries(value).map(([k, v]) => [escapeContent(tokenizer, k), escape(v)]));
      return value;
    };
    escaped = needs(tools) ? (escape(tools) as ToolSchema[]) : tools;
    byTools.set(tools, escaped);
  }
  return escaped;
}

const escapedTools = new WeakMap<Tokenizer, WeakMap<readonly ToolSchema[], readonly ToolSchema[]>>();

/**
 * Rendered text cut into template parts and literal parts (the strings the placeholders stand for), or
 * undefined when the text has no placeholder. A plane-15 character that is no placeholder of this tokenizer
 * stays template text (it is no added token either way).
 */
export function literalParts(tokenizer: Tokenizer, text: string): TextPart[] | undefined {
  if (!PLANE.test(text)) return undefined;
  const tokens = tokenizer.addedTokens;
  const parts: TextPart[] = [];
  let at = 0;
  for (const match of text.matchAll(PLACEHOLDERS)) {
    const found = match[0];
    let literal: string | undefined;
    if (found.startsWith(ESCAPE)) literal = found.slice(ESCAPE.length);
    else literal = tokens[found.codePointAt(0)! - FIRST_PLACEHOLDER];
    if (literal === undefined) continue;
    if (match.index > at) parts.push({ text: text.slice(at, match.index), literal: false });
    parts.push({ text: literal, literal: true });
    at = match.index + found.length;
  }
  if (at < text.length) parts.push({ text: text.slice(at), literal: false });
  return parts;
}

/** The text a rendered string stands for: placeholders replaced by their strings. */
export function expandPlaceholders(tokenizer: Tokenizer, text: string): string {
  const parts = literalParts(tokenizer, text);
  return parts === undefined ? text : parts.map((p) => p.text).join('');
}

/**
 * Encodes text rendered from escaped messages: the template's added tokens become their ids, environment
 * content is plain text (see the module comment). Text without placeholders encodes exactly as
 * `tokenizer.encode`. Throws `internal` when the ids hold an added token the template did not write.
 */
export function encodeRendered(tokenizer: Tokenizer, text: string): number[] {
  const parts = literalParts(tokenizer, text) ?? [{ text, literal: false }];
  const ids = tokenizer.encodeParts(parts);
  verifyTemplateTokens(tokenizer, parts, ids);
  return ids;
}

/**
 * Throws `internal` unless `ids` (the encoding of `parts`) hold exactly as many added-token ids as the template
 * parts hold added-token strings: a mask-0 span whose special tokens are not all the template's would condition
 * the policy on a forged turn, so it must never reach a trainer.
 */
export function verifyTemplateTokens(tokenizer: Tokenizer, parts: readonly TextPart[], ids: readonly number[]): void {
  const { added, addedIds } = compiled(tokenizer);
  let written = 0;
  if (added) {
    for (const part of coalesce(parts)) {
      if (part.literal) continue;
      // exec on the shared global regex rather than matchAll (a clone of it per call); lastIndex reset first.
      added.lastIndex = 0;
      while (added.exec(part.text) !== null) written++;
    }
  }
  let found = 0;
  for (const id of ids) if (addedIds.has(id)) found++;
  if (found !== written) {
    throw new RolloutError(
      'internal',
      `environment text encoded to added tokens: ${found} added-token ids where the template wrote ${written}`,
    );
  }
}

/** The parts with each run of neighbours of one kind joined into one part. */
export function coalesce(parts: readonly TextPart[]): TextPart[] {
  const out: TextPart[] = [];
  for (const part of parts) {
    const last = out.at(-1);
    if (last !== undefined && last.literal === part.literal) last.text += part.text;
    else out.push({ ...part });
  }
  return out;
}
