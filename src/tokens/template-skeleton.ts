import { tokenize } from '@huggingface/jinja';
import { AdaptedChatTemplate } from './adapted-template.js';
import { isRenderOverrun, JinjaChatTemplate } from './chat-template.js';
import { toolsKey } from './tools-key.js';
import type { ChatMessage, ChatTemplate, ToolSchema } from './types.js';

/**
 * Render-free rendering: a template's output for a conversation *shape*, with each content left as a slot.
 *
 * Rendering a chat template runs @huggingface/jinja's interpreter, which allocates a runtime object per value: the
 * largest share of a short trajectory's server CPU and garbage (the first prompt with its tool schemas, ~150 µs of
 * CPU, rendered for every task). Most templates write a message's content verbatim between text that depends only on
 * the roles, names and tools: such a template's render is the same text for every content, with the contents
 * spliced in. That text, cut at the contents, is a *skeleton*; filling it is a few string joins.
 *
 * Whether a template writes the contents of a shape verbatim is a property of the template (the Llama 3.1 and Gemma 3
 * templates trim contents, Qwen3's parses <think> out of assistant contents), so it is probed per shape on first use,
 * as suffix-delta.ts probes locality: the shape is rendered with marker contents (each must appear exactly once, in
 * order), then with a battery of contents (empty, padded, multi-line, markup, thinking blocks, tool-response
 * wrappers, added-token look-alikes) and each render must equal its filled skeleton. A shape that fails any probe,
 * or that the template refuses, is remembered as such and always rendered. No fixed battery holds the flags a
 * template may test contents for (SmolLM3 reads "/no_think" out of its system prompt and changes every generation
 * prompt), so the probe also tries every flag of the template's own source ({@link contentFlags}) in every slot.
 * Assistant messages are never slots: templates commonly branch on their contents (reasoning), so a conversation
 * holding one as a slot is rendered. test/tokens/template-skeleton.property.test.ts checks filled == rendered over
 * random hostile conversations for every family we ship, content-dependent-templates.property.test.ts for templates
 * that branch on contents.
 */

/** A render cut at the slot contents: `pieces[0] slot0 pieces[1] slot1 ... pieces[n]`. */
export interface Skeleton {
  readonly pieces: readonly string[];
}

/** The options a template renders with. */
export interface RenderOptions {
  addGenerationPrompt: boolean;
  tools?: readonly ToolSchema[];
}

/**
 * What `template.render(messages, options)` gives, from a skeleton when the shape of `messages` was probed
 * verbatim, else from the template. Messages in `slots` (indexes into `messages`) have their contents filled in;
 * the others are part of the shape (their contents too). Always exactly the render's text.
 */
export function renderWithSkeleton(template: ChatTemplate, messages: readonly ChatMessage[], options: RenderOptions, slots: readonly number[]): string {
  const skeleton = skeletonFor(template, messages, options, slots);
  return skeleton ? fillSkeleton(skeleton, slots.map((i) => messages[i]!.content)) : template.render(messages, options);
}

/** The indexes of every message that may be a slot (all but assistant messages). */
export function contentSlots(messages: readonly ChatMessage[]): number[] {
  const slots: number[] = [];
  for (let i = 0; i < messages.length; i++) if (messages[i]!.role !== 'assistant') slots.push(i);
  return slots;
}

/** `pieces[0] contents[0] pieces[1] ...`. */
export function fillSkeleton(skeleton: Skeleton, contents: readonly string[]): string {
  const { pieces } = skeleton;
  let out = pieces[0]!;
  for (let i = 0; i < contents.length; i++) out += contents[i]! + pieces[i + 1]!;
  return out;
}

/**
 * The skeleton of the shape of `messages` (roles, names, the contents of non-slot messages, the options), probed and
 * cached per template and tool list; undefined when the template does not write that shape's slot contents verbatim.
 */
export function skeletonFor(template: ChatTemplate, messages: readonly ChatMessage[], options: RenderOptions, slots: readonly number[]): Skeleton | undefined {
  const slot = new Set(slots);
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!;
    // Assistant contents are never slots; other fixed contents are part of the key, so only short ones are.
    if (slot.has(i) ? m.role === 'assistant' : m.content.length > MAX_FIXED_CHARS) return undefined;
  }
  if (slots.some((i) => messages[i] === undefined)) return undefined;
  let cache = skeletons.get(template);
  if (!cache) skeletons.set(template, (cache = { shapes: new Map(), nameBlind: new Map(), namedShapes: new Map(), bytes: 0 }));
  const tools = toolsKey(options.tools);
  // A tool message's name is part of the shape, and it may be one the policy made up (a call to a tool that does not
  // exist): each new name was a new shape, probed with ~80 renders on the event loop (3 ms a turn for Qwen3, whose
  // template does not even print names) and kept. A shape whose render does not depend on its names (probed once,
  // names in every form a template may test) is keyed, and its skeleton probed, with a stand-in name instead.
  let shape = messages;
  let named: string | undefined;
  if (messages.some((m) => m.name !== undefined)) {
    const renamed = messages.map((m) => (m.name === undefined ? m : { ...m, name: NAME_STAND_IN }));
    const blindKey = `${tools}\u0000${shapeKey(renamed, options, slot)}`;
    let blind = cache.nameBlind.get(blindKey);
    if (blind === undefined && cache.bytes < MAX_CACHE_BYTES) {
      blind = ignoresNames(template, messages, options, slots);
      cache.nameBlind.set(blindKey, blind);
      cache.bytes += 2 * blindKey.length + 64;
    }
    if (blind === true) shape = renamed;
    else if (blind === false) {
      // The render depends on the names (Llama 3.1's and Gemma 3's adapted templates print them in the tool output's
      // header). When the shape has no skeleton with the stand-in names — those templates trim contents, so none of
      // their shapes has one — it is rendered for every name, without a probe and an entry per name: a policy
      // inventing a name per turn paid three renders of probing each turn (0.3-0.7 ms) and filled the cache with one
      // dead entry per name. Otherwise each name is a shape of its own, at most MAX_NAMES_PER_SHAPE of them.
      if (lookup(cache, template, blindKey, renamed, options, slots) === undefined) return undefined;
      named = blindKey;
    }
  }
  const key = `${tools}\u0000${shapeKey(shape, options, slot)}`;
  if (named !== undefined && !cache.shapes.has(key)) {
    const count = cache.namedShapes.get(named) ?? 0;
    if (count >= MAX_NAMES_PER_SHAPE) return undefined;
    cache.namedShapes.set(named, count + 1);
  }
  return lookup(cache, template, key, shape, options, slots);
}

/** The cached skeleton of `key`, probed on first use while the cache is under its bound. */
function lookup(cache: SkeletonCache, template: ChatTemplate, key: string, shape: readonly ChatMessage[], options: RenderOptions, slots: readonly number[]): Skeleton | undefined {
  const found = cache.shapes.get(key);
  if (found !== undefined) return found ?? undefined;
  // Shapes are few (roles, the tool names a template reads, tool lists). Past the bound a new shape is rendered, not
  // probed: a probe costs a dozen renders, which only pays when its skeleton is kept.
  if (cache.bytes >= MAX_CACHE_BYTES) return undefined;
  const skeleton = probe(template, shape, options, slots);
  cache.shapes.set(key, skeleton ?? null);
  cache.bytes += 2 * (key.length + (skeleton?.pieces.reduce((n, p) => n + p.length, 0) ?? 0)) + 64;
  return skeleton;
}

interface SkeletonCache {
  shapes: Map<string, Skeleton | null>;
  /** Whether a shape's render ignores its tool messages' names, by the shape's key with stand-in names. */
  nameBlind: Map<string, boolean>;
  /** How many shapes of real names were probed per shape with stand-in names (one whose render prints them). */
  namedShapes: Map<string, number>;
  bytes: number;
}

/** What {@link skeletonFor} keeps for a template: its shapes (with or without a skeleton), and the bytes counted. */
export function skeletonCacheSize(template: ChatTemplate): { shapes: number; nameBlind: number; bytes: number } {
  const cache = skeletons.get(template);
  return { shapes: cache?.shapes.size ?? 0, nameBlind: cache?.nameBlind.size ?? 0, bytes: cache?.bytes ?? 0 };
}

/**
 * Names probed as shapes of their own, per shape whose render depends on its tool messages' names and that has a
 * skeleton (a template that both prints names and writes contents verbatim): the tools an environment really has, and
 * a few the policy made up; past it a new name's shape is rendered.
 */
const MAX_NAMES_PER_SHAPE = 32;

/** Most bytes of shape keys and skeletons kept per template (UTF-16 code units, two bytes each). */
const MAX_CACHE_BYTES = 16 << 20;
const MAX_FIXED_CHARS = 64;
const skeletons = new WeakMap<ChatTemplate, SkeletonCache>();

/** The tool name a shape whose render ignores names is keyed and probed with. */
const NAME_STAND_IN = 'probe-name-7c1e';

/**
 * Whether the render of the shape of `messages` (slot contents as markers, other contents as they are) is the same
 * text whatever its tool messages' names: the stand-in, another name, the empty name (a template may test a name's
 * truthiness) and every flag of the template (contentFlags: a name it compares with), rotated over the named messages.
 * A render the template refuses for some name, and one that prints or branches on them, is not.
 */
function ignoresNames(template: ChatTemplate, messages: readonly ChatMessage[], options: RenderOptions, slots: readonly number[]): boolean {
  const named = messages.flatMap((m, i) => (m.name === undefined ? [] : [i]));
  const slotOf = new Map(slots.map((index, k) => [index, k]));
  const withNames = (names: (j: number) => string): ChatMessage[] =>
    messages.map((m, i) => {
      const k = slotOf.get(i);
      const content = k === undefined ? m.content : marker(k);
      const j = named.indexOf(i);
      return j < 0 ? { ...m, content } : { ...m, content, name: names(j) };
    });
  const flags = contentFlags(template);
  const variants: ((j: number) => string)[] = [() => 'another_name', () => '', ...flags.map((_, r) => (j: number) => flags[(r + j) % flags.length]!)];
  try {
    const base = template.render(withNames(() => NAME_STAND_IN), options);
    return variants.every((names) => template.render(withNames(names), options) === base);
  } catch (err) {
    if (isRenderOverrun(err)) throw err;
    return false;
  }
}

function shapeKey(messages: readonly ChatMessage[], options: RenderOptions, slot: ReadonlySet<number>): string {
  return JSON.stringify([options.addGenerationPrompt, messages.map((m, i) => [m.role, m.name ?? null, slot.has(i) ? null : m.content])]);
}

/** Slot markers: plane-16 private-use characters (never placeholders, see opaque-content.ts) around the slot's index. */
const marker = (i: number): string => `\u{10FFF0}slot-${i}-7c1e\u{10FFF0}`;

/**
 * Long contents of varied lengths: a template may cap or branch on a content's length (`content|length > 64`,
 * `content[:4096]`), which no string literal of its source reveals. Past the longest, a cap goes unseen: 70,000
 * characters is beyond every cap seen in real templates, and still a ~1 ms render per probed shape.
 */
export const LONG_PROBE_CONTENTS = [100, 700, 5_000, 70_000].map((n) => {
  const unit = 'long content, line by line\n';
  return `${unit.repeat(Math.ceil(n / unit.length))}`.slice(0, n - 1) + '.';
});

/** Contents templates treat differently (trim, emptiness, markup, reasoning, tool-response wrappers, special-token look-alikes, length). */
const PROBE_CONTENTS = [
  'c',
  '',
  '  padded content \n',
  'line one\nline two\n\n',
  '{{ not a tag }} <b>',
  '<think>\nhm\n</think>\n\nsaid',
  '<tool_response>\nx\n</tool_response>',
  '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
  '\u{F0000}\u{FFFFD}<',
  ' ',
  '\n',
  ...LONG_PROBE_CONTENTS,
];

function probe(template: ChatTemplate, messages: readonly ChatMessage[], options: RenderOptions, slots: readonly number[]): Skeleton | undefined {
  const withContents = (contents: readonly string[]): ChatMessage[] => {
    const out = messages.map((m) => ({ ...m }));
    slots.forEach((index, k) => (out[index]!.content = contents[k]!));
    return out;
  };
  let marked: string;
  try {
    marked = template.render(withContents(slots.map((_, k) => marker(k))), options);
  } catch (err) {
    if (isRenderOverrun(err)) throw err;
    return undefined; // a shape the template refuses: rendered, so the refusal is the template's own
  }
  const pieces: string[] = [];
  let from = 0;
  for (let k = 0; k < slots.length; k++) {
    // Exactly once, and after the slot before it: a template that repeats or reorders contents has no skeleton.
    const at = marked.indexOf(marker(k));
    if (at < from || marked.indexOf(marker(k), at + 1) >= 0) return undefined;
    pieces.push(marked.slice(from, at));
    from = at + marker(k).length;
  }
  pieces.push(marked.slice(from));
  const skeleton: Skeleton = { pieces };
  // Every probe content in every slot, distinct contents side by side, then every flag the template may test for in
  // every slot (rotated, so a shape costs one render per flag whatever its number of slots).
  const flags = contentFlags(template);
  const rounds = PROBE_CONTENTS.length + 1 + flags.length;
  for (let r = 0; r < rounds; r++) {
    const contents = slots.map((_, k) =>
      r < PROBE_CONTENTS.length
        ? PROBE_CONTENTS[(r + k) % PROBE_CONTENTS.length]!
        : r === PROBE_CONTENTS.length
          ? `content ${k}`
          : flags[(r - PROBE_CONTENTS.length - 1 + k) % flags.length]!,
    );
    let rendered: string;
    try {
      rendered = template.render(withContents(contents), options);
    } catch (err) {
      if (isRenderOverrun(err)) throw err;
      return undefined;
    }
    if (rendered !== fillSkeleton(skeleton, contents)) return undefined;
  }
  return skeleton;
}

/**
 * Contents a template may branch on: the string literals of its source that are not plain output, then each one
 * joined to the next. A template that tests a content (`"/no_think" in messages[0].content`, `startswith`,
 * `replace`, `==`) tests it against a literal of its own, so these are the contents a probe must try to see such a
 * branch, where a fixed battery only sees the branches of the templates it was written for. A literal counts unless
 * it is only a piece of an output expression (`{{ '<|im_start|>' + m.role }}`); one in a statement (`{% set %}`)
 * is kept, since a variable may carry it to the test. The joined pairs reach tests of two literals together (Qwen3
 * takes a user message that starts with "<tool_response>" and ends with "</tool_response>" for a tool result).
 * Cached per template; none for a template without a Jinja source (a stand-in), which is then probed with the fixed
 * batteries alone. At most {@link MAX_FLAGS}, single literals first: each costs a render per probed shape.
 */
export function contentFlags(template: ChatTemplate): readonly string[] {
  let flags = flagCache.get(template);
  if (flags === undefined) flagCache.set(template, (flags = findFlags(templateSource(template))));
  return flags;
}

const MAX_FLAGS = 64;
const flagCache = new WeakMap<ChatTemplate, readonly string[]>();

/** The Jinja source a template renders, through the adapter that shapes its messages (adapted-template.ts). */
function templateSource(template: ChatTemplate): string | undefined {
  if (template instanceof JinjaChatTemplate) return template.source;
  if (template instanceof AdaptedChatTemplate) return templateSource(template.inner);
  return undefined;
}

function findFlags(source: string | undefined): readonly string[] {
  if (source === undefined) return [];
  let tokens: ReturnType<typeof tokenize>;
  try {
    // As the Template constructor tokenizes; literals do not depend on it, only whitespace outside them does.
    tokens = tokenize(source, { lstrip_blocks: true, trim_blocks: true });
  } catch {
    return []; // a source that does not parse does not render either
  }
  // Plain output: inside `{{ }}`, between its delimiters and concatenation operators only.
  const joins = new Set<string | undefined>(['OpenExpression', 'CloseExpression', 'AdditiveBinaryOperator']);
  const singles = new Set<string>();
  let output = false;
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i]!;
    if (t.type === 'OpenExpression' || t.type === 'CloseExpression') output = t.type === 'OpenExpression';
    if (t.type !== 'StringLiteral' || t.value === '') continue;
    if (!(output && joins.has(tokens[i - 1]?.type) && joins.has(tokens[i + 1]?.type))) singles.add(t.value);
  }
  const single = [...singles].slice(0, MAX_FLAGS);
  const flags = [...single];
  for (let i = 0; i + 1 < single.length && flags.length < MAX_FLAGS; i++) flags.push(single[i]! + single[i + 1]!);
  return flags;
}
