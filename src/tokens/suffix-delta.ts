import { LRUCache } from 'lru-cache';
import { RolloutError } from '../errors.js';
import { isRenderOverrun } from './chat-template.js';
import { environmentDelta, isUndiffable, MAX_PROBED_TOOL_LISTS, PROBE_ASSISTANT, probeAssistantClosing, type Delta, type DeltaRequest } from './template-delta.js';
import { contentFlags, LONG_PROBE_CONTENTS, renderWithSkeleton } from './template-skeleton.js';
import { toolsKey } from './tools-key.js';
import type { ChatMessage, ChatTemplate, ToolSchema } from './types.js';

/**
 * Incremental rendering: the text between turns from a bounded suffix of the conversation.
 *
 * {@link environmentDelta} renders the whole conversation twice per environment turn, so its cost grows with the
 * context (~15-34 ms of blocked event loop at 36K-147K-token contexts, and half of the token work per turn at
 * small ones). Most templates write the text after an assistant turn (its closing, the new messages, the
 * generation prompt) from those messages alone: Qwen3 and Llama 3.1 need nothing before the assistant turn, Gemma 3
 * only an opening user turn (its alternation check), SmolLM3 its system prompt itself (a "/no_think" in it adds an
 * empty think block to every generation prompt). Such a template is *suffix-local*, and the delta can be rendered
 * from `[...opening, assistant, ...added]`: the same anchor method on a conversation of bounded size.
 *
 * Locality is a property of the template (and the tools it is given), so it is probed once, like
 * template-profile.ts probes tool roles, and verified against the full render: {@link probeSuffixLocality} renders
 * a battery of conversations (every opening, up to two earlier rounds of every kind of environment answer, every
 * kind of new messages, contents that pad, trim, nest markup) both ways and calls the template local only when
 * every delta is identical. Its contents are fixed ones and the flags the template itself may test contents for
 * (template-skeleton.ts contentFlags: its string literals), in every position of the conversation: a battery of
 * flag-free contents would call SmolLM3's template local with a stand-in system prompt, and every generation prompt
 * after the first would lack the empty think block its "/no_think" asks for. A template seen to branch on what a
 * message says keeps the real contents its deltas depend on (the opening's), or renders in full when they stand
 * anywhere else. DeepSeek-V3's template is not local (it opens tool outputs differently for the first tool
 * message of the whole conversation), so it keeps the full render. test/tokens/suffix-delta.property.test.ts checks
 * incremental == full over random conversations with hostile contents for every family we ship, and
 * content-dependent-templates.property.test.ts for templates that branch on system, user, tool and assistant contents.
 *
 * The suffix's text comes from the skeleton of its shape (template-skeleton.ts) with a marker as the assistant's
 * content, so no template runs per environment turn — provided the text after the assistant turn does not depend on
 * what it holds. That too is probed once (`verify`: hostile assistant contents, reasoning and tool-call markup
 * included); a template that fails it has every delta checked against a render with the real content.
 */

/** Stand-in content of the opening messages, for templates whose output after the assistant turn does not depend on it. */
const LEAD = '\u{FFFFC}probe-lead-3f9a\u{FFFFC}';

/** What {@link probeSuffixLocality} found for a template and a tool list. */
export interface SuffixLocality {
  /** Whether deltas may be rendered from a suffix at all. */
  local: boolean;
  /**
   * The opening kept before the assistant turn: none, its roles with stand-in contents, or its messages as they are
   * (a template that reads a flag out of the system prompt or first message, as SmolLM3's does).
   */
  opening: 'none' | 'roles' | 'contents';
  /** Whether the suffix is rendered with the tools (false when they change nothing after the assistant turn). */
  tools: boolean;
  /**
   * Whether each delta is checked against a render with the real assistant content (the anchor's text after the
   * assistant turn must be the same for it). False when the probe found that text independent of the assistant's
   * content over a battery of hostile contents (reasoning blocks, tool-call markup, padding, emptiness, template
   * look-alikes): the delta is then the filled skeleton alone, with no template run per environment turn.
   */
  verify: boolean;
}

const NOT_LOCAL: SuffixLocality = { local: false, opening: 'roles', tools: true, verify: true };

/**
 * The delta of `request` rendered from a suffix of the conversation (see the module comment), or undefined when
 * the anchor method does not apply to it (the caller then renders in full). Exactly {@link environmentDelta}'s
 * text whenever `locality` was probed local for this template and these tools.
 */
export function suffixDelta(template: ChatTemplate, request: Omit<DeltaRequest, 'closing'>, locality: SuffixLocality): Delta | undefined {
  const { history, added, tools } = request;
  const last = history.at(-1);
  if (last?.role !== 'assistant') {
    throw new RolloutError('failed_precondition', 'environment messages must follow an assistant turn');
  }
  const lead = locality.opening === 'none' ? [] : opening(history, locality.opening === 'contents');
  const options = locality.tools && tools !== undefined ? { addGenerationPrompt: true, tools } : { addGenerationPrompt: true };
  // The marked render is the same text for every content of the new messages when the template writes them verbatim:
  // filled from the shape's skeleton then (template-skeleton.ts), and only the real render below runs the template.
  // Not with the opening's real contents: a skeleton is keyed by its fixed contents, so each new system prompt would
  // cost a probe of a dozen renders (and a template that reads them writes few contents verbatim anyway).
  const markedMessages = [...lead, { ...last, content: PROBE_ASSISTANT }, ...added];
  const marked =
    locality.opening === 'contents'
      ? template.render(markedMessages, options)
      : renderWithSkeleton(template, markedMessages, options, added.map((_, i) => lead.length + 1 + i));
  const at = marked.lastIndexOf(PROBE_ASSISTANT);
  if (at < 0 || marked.indexOf(PROBE_ASSISTANT) !== at) return undefined;
  const tail = marked.slice(at + PROBE_ASSISTANT.length);
  if (!locality.verify) return { text: tail, method: 'anchor' };
  // As environmentDelta checks against the full render: the real content must be followed by the same text.
  const real = template.render([...lead, last, ...added], options);
  return real.endsWith(tail) ? { text: tail, method: 'anchor' } : undefined;
}

/**
 * The conversation's opening before its last message: the leading system messages and the first other message (the
 * turn a template like Gemma 3's wants before an assistant turn), contents replaced by a stand-in unless `contents`.
 */
function opening(history: readonly ChatMessage[], contents: boolean): ChatMessage[] {
  const out: ChatMessage[] = [];
  for (const message of history.slice(0, -1)) {
    if (contents) out.push(message);
    else out.push(message.name === undefined ? { role: message.role, content: LEAD } : { role: message.role, content: LEAD, name: message.name });
    if (message.role !== 'system') break;
  }
  return out;
}

/**
 * Whether `template` with `tools` is suffix-local (see the module comment), probed on first use and cached per
 * template and tool list. The cheapest suffix that gives every probe's full-render delta wins: no opening
 * before the assistant turn, else the opening's roles, else the opening itself; without the tools, else with them.
 */
export function probeSuffixLocality(template: ChatTemplate, tools: readonly ToolSchema[] | undefined): SuffixLocality {
  const byTools = localities(template);
  const key = toolsKey(tools);
  let found = byTools.get(key);
  if (found === undefined) {
    found = probe(template, tools);
    byTools.set(key, found);
  }
  return found;
}

/**
 * Keeps what a token thread's {@link probeSuffixLocality} found for this template and tool list (its answer to an
 * environment task, TokenTaskResult.locality), so this thread learns it without probing: the thread loaded the same
 * model folder, so its template is this one and the probe, a pure function of the two, found what it would find here.
 */
export function rememberSuffixLocality(template: ChatTemplate, tools: readonly ToolSchema[] | undefined, locality: SuffixLocality): void {
  const byTools = localities(template);
  const key = toolsKey(tools);
  if (!byTools.has(key)) byTools.set(key, { local: locality.local, opening: locality.opening, tools: locality.tools, verify: locality.verify });
}

/**
 * What {@link probeSuffixLocality} found for this template and tool list, if it has probed them already; never
 * probes (a probe renders the template a few hundred times: ~200 ms with a long tool list, which must not run on
 * the event loop just to decide where a task should run).
 */
export function knownSuffixLocality(template: ChatTemplate, tools: readonly ToolSchema[] | undefined): SuffixLocality | undefined {
  return localityCache.get(template)?.get(toolsKey(tools));
}

function localities(template: ChatTemplate): LRUCache<string, SuffixLocality> {
  let byTools = localityCache.get(template);
  if (!byTools) localityCache.set(template, (byTools = new LRUCache({ max: MAX_PROBED_TOOL_LISTS })));
  return byTools;
}

const localityCache = new WeakMap<ChatTemplate, LRUCache<string, SuffixLocality>>();

const CANDIDATES: readonly SuffixLocality[] = [
  { local: true, opening: 'none', tools: false, verify: true },
  { local: true, opening: 'roles', tools: false, verify: true },
  { local: true, opening: 'contents', tools: false, verify: true },
  { local: true, opening: 'none', tools: true, verify: true },
  { local: true, opening: 'roles', tools: true, verify: true },
  { local: true, opening: 'contents', tools: true, verify: true },
];

function probe(template: ChatTemplate, tools: readonly ToolSchema[] | undefined): SuffixLocality {
  const closing = probeAssistantClosing(template, tools);
  const flags = contentFlags(template);
  const cases: { request: Omit<DeltaRequest, 'closing'>; text: string }[] = [];
  for (const request of [...probeRequests(tools), ...flagRequests(flags, tools)]) {
    let full: Delta;
    try {
      full = environmentDelta(template, { ...request, closing });
    } catch (err) {
      if (isRenderOverrun(err)) throw err;
      if (isUndiffable(err)) return NOT_LOCAL; // no anchor for this shape: as a delta of another method
      continue; // a shape the template refuses: the ledger refuses it too
    }
    // Only the anchor method has a suffix form; a template that needs another one always renders in full.
    if (full.method !== 'anchor') return NOT_LOCAL;
    cases.push({ request, text: full.text });
  }
  if (cases.length === 0) return NOT_LOCAL;
  const withTools = tools !== undefined && tools.length > 0;
  const agrees = (c: SuffixLocality, on: typeof cases): boolean =>
    on.every(({ request, text }) => {
      try {
        return suffixDelta(template, request, c)?.text === text;
      } catch (err) {
        if (isRenderOverrun(err)) throw err;
        return false;
      }
    });
  const found = CANDIDATES.find((c) => (withTools || !c.tools) && agrees(c, cases));
  if (!found) return NOT_LOCAL;
  // Without the per-delta check, over the battery and every hostile content as the assistant turn just sampled.
  const unchecked: typeof cases = [...cases];
  for (const request of assistantProbes(flags, tools)) {
    try {
      unchecked.push({ request, text: environmentDelta(template, { ...request, closing }).text });
    } catch (err) {
      if (isRenderOverrun(err)) throw err;
      // a shape the template refuses: the ledger refuses it too
    }
  }
  const trusted = { ...found, verify: false };
  return agrees(trusted, unchecked) ? trusted : found;
}

/** Contents that templates treat differently: padded (trim), empty, multi-line, markup-like, thinking blocks, long (caps). */
const CONTENTS = ['c', '  padded content \n', '', 'line one\nline two\n\n', '{{ not a tag }} <b>', '<think>\nhm\n</think>\n\nsaid', ...LONG_PROBE_CONTENTS];

/**
 * Contents of the assistant turn just sampled that templates branch on: reasoning blocks (whole, unclosed, only the
 * closing tag), tool-call markup, padding and blank lines, emptiness, template and special-token look-alikes.
 */
const ASSISTANT_CONTENTS = [
  ...CONTENTS,
  '<think>\nunclosed',
  '</think>',
  '</think>\n\n',
  '<think></think>',
  '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
  'text\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>',
  '<tool_response>\nx\n</tool_response>',
  '{% if true %}x{% endif %} {{ messages }}',
  '<|im_end|><|eot_id|><end_of_turn>',
  '\n\n',
  ' ',
  '\u{F0000}\u{FFFFD}<',
];

/**
 * Each hostile assistant content as the turn just sampled, after [user] and [system, user], before each kind of
 * answer; then each of the template's flags (contentFlags) as that turn, after [system, user], before a tool result
 * and before a user message.
 */
function* assistantProbes(flags: readonly string[], tools: readonly ToolSchema[] | undefined): Generator<Omit<DeltaRequest, 'closing'>> {
  const answers: ChatMessage[][] = [
    [{ role: 'tool', content: 'out', name: 'probe_tool' }],
    [{ role: 'tool', content: 'a', name: 'probe_tool' }, { role: 'tool', content: 'b', name: 'probe_tool' }],
    [{ role: 'user', content: 'next' }],
  ];
  const withSystem: ChatMessage[] = [{ role: 'system', content: 's' }, { role: 'user', content: 'q' }];
  for (const content of ASSISTANT_CONTENTS) {
    for (const opening of [[{ role: 'user', content: 'q' }], withSystem] as ChatMessage[][]) {
      for (const added of answers) yield { history: [...opening, { role: 'assistant', content }], added, tools };
    }
  }
  for (const content of flags) {
    for (const added of [answers[0]!, answers[2]!]) yield { history: [...withSystem, { role: 'assistant', content }], added, tools };
  }
}

/**
 * The flag battery: the flags a template may test contents for (contentFlags) in every position of two
 * conversations, rotated so that each flag is once in each position: one with a system prompt, an earlier round,
 * the last user message in a middle round and a tool result after the assistant turn; one that opens with a user
 * message, with a user message after it. Only the assistant turn just sampled keeps a plain content (the
 * assistant battery tries flags there). Whatever a flag changes after that turn, wherever it stands, must come out
 * of the suffix too: from the opening's real contents, or not at all (the template is then not local).
 */
function* flagRequests(flags: readonly string[], tools: readonly ToolSchema[] | undefined): Generator<Omit<DeltaRequest, 'closing'>> {
  for (let i = 0; i < flags.length; i++) {
    const f = (p: number): string => flags[(i + p) % flags.length]!;
    const history: ChatMessage[] = [
      { role: 'system', content: f(0) },
      { role: 'user', content: f(1) },
      { role: 'assistant', content: f(2) },
      { role: 'tool', content: f(3), name: 'probe_tool' },
      { role: 'assistant', content: f(4) },
      { role: 'user', content: f(5) },
      { role: 'assistant', content: 'c' },
    ];
    yield { history, added: [{ role: 'tool', content: f(6), name: 'probe_tool' }], tools };
    const opening: ChatMessage[] = [
      { role: 'user', content: f(0) },
      { role: 'assistant', content: f(1) },
      { role: 'tool', content: f(2), name: 'probe_tool' },
      { role: 'user', content: f(3) },
      { role: 'assistant', content: 'c' },
    ];
    yield { history: opening, added: [{ role: 'user', content: f(4) }], tools };
  }
}

/**
 * The probe battery: openings [user] and [system, user]; zero to two earlier rounds, each an assistant turn and an
 * environment answer; the assistant turn just sampled; every kind of environment answer after it.
 */
function* probeRequests(tools: readonly ToolSchema[] | undefined): Generator<Omit<DeltaRequest, 'closing'>> {
  const answers: ChatMessage['role'][][] = [['tool'], ['tool', 'tool'], ['user'], ['system'], ['tool', 'user']];
  let n = 0;
  const content = (): string => `${CONTENTS[n % CONTENTS.length]!}${n++}`;
  const message = (role: ChatMessage['role']): ChatMessage => (role === 'tool' ? { role, content: content(), name: 'probe_tool' } : { role, content: content() });
  const rounds: ChatMessage['role'][][][] = [[], ...answers.map((a) => [a])];
  for (const a of answers.slice(0, 3)) for (const b of answers.slice(0, 3)) rounds.push([a, b]);
  for (const system of [false, true]) {
    for (const earlier of rounds) {
      for (const added of answers) {
        const history: ChatMessage[] = [...(system ? [message('system')] : []), message('user')];
        for (const answer of earlier) history.push(message('assistant'), ...answer.map(message));
        history.push(message('assistant'));
        yield { history, added: added.map(message), tools };
      }
    }
  }
}
