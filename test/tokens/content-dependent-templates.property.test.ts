import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { JinjaChatTemplate } from '../../src/tokens/chat-template.js';
import { probeSuffixLocality, suffixDelta, type SuffixLocality } from '../../src/tokens/suffix-delta.js';
import { environmentDelta, probeAssistantClosing } from '../../src/tokens/template-delta.js';
import { contentFlags, contentSlots, renderWithSkeleton, skeletonFor } from '../../src/tokens/template-skeleton.js';
import type { ChatMessage, ToolSchema } from '../../src/tokens/types.js';
import { bashTool, hostileText } from './fixtures.js';

/**
 * Templates whose output depends on what a message says, not only on its role: each incremental path (the suffix
 * delta, the skeleton) must still give exactly the full render, by seeing the dependence in its probe and keeping
 * the contents it needs, or by rendering in full. Their flags are plain text, as real ones are ("/no_think"), so
 * escaping (opaque-content.ts) leaves them for the template to see.
 */

/**
 * SmolLM3's pattern (HuggingFaceTB/SmolLM3-3B): "/no_think" or "/think" in the system prompt picks the reasoning
 * mode, which every generation prompt shows; the flags are cut out of the system prompt, "/system_override" drops
 * the metadata header.
 */
const SYSTEM_FLAG = new JinjaChatTemplate(
  [
    '{%- set reasoning_mode = "/think" -%}{%- set system_message = "" -%}',
    '{%- if messages[0].role == "system" -%}{%- set system_message = messages[0].content -%}',
    '{%- if "/no_think" in system_message -%}{%- set reasoning_mode = "/no_think" -%}{%- elif "/think" in system_message -%}{%- set reasoning_mode = "/think" -%}{%- endif -%}',
    '{%- endif -%}',
    '{%- set custom = system_message.replace("/no_think", "").replace("/think", "").rstrip() -%}',
    '{{- "<|im_start|>system\\n" -}}',
    '{%- if "/system_override" in system_message -%}{{- custom.replace("/system_override", "").rstrip() -}}',
    '{%- else -%}{{- "## Metadata\\nReasoning Mode: " + reasoning_mode + "\\n\\n" + custom -}}{%- endif -%}',
    '{{- "<|im_end|>\\n" -}}',
    '{%- for m in messages -%}{%- if m.role != "system" or not loop.first -%}',
    '{{- "<|im_start|>" + (m.role if m.role != "tool" else "user") + "\\n" + m.content + "<|im_end|>\\n" -}}',
    '{%- endif -%}{%- endfor -%}',
    '{%- if add_generation_prompt -%}',
    '{%- if reasoning_mode == "/think" -%}{{- "<|im_start|>assistant\\n" -}}{%- else -%}{{- "<|im_start|>assistant\\n<think>\\n\\n</think>\\n" -}}{%- endif -%}',
    '{%- endif -%}',
  ].join(''),
);

/** The last user message's "/no_think" sets the generation prompt: it may stand anywhere before the assistant turn. */
const LAST_QUERY_FLAG = new JinjaChatTemplate(
  [
    '{%- set ns = namespace(mode="think") -%}',
    '{%- for m in messages if m.role == "user" -%}{%- set ns.mode = "no_think" if "/no_think" in m.content else "think" -%}{%- endfor -%}',
    '{%- for m in messages -%}{{- "<|im_start|>" + m.role + "\\n" + m.content + "<|im_end|>\\n" -}}{%- endfor -%}',
    '{%- if add_generation_prompt -%}{{- "<|im_start|>assistant\\n" -}}{%- if ns.mode == "no_think" -%}{{- "<think>\\n\\n</think>\\n" -}}{%- endif -%}{%- endif -%}',
  ].join(''),
);

/** Tool results and user messages rendered by what they say: a failed command gets its own header, an image a tag. */
const MESSAGE_FLAG = new JinjaChatTemplate(
  [
    '{%- for m in messages -%}',
    '{%- if m.role == "tool" and m.content.startswith("Error:") -%}{{- "<|im_start|>tool failed\\n" + m.content.replace("Error:", "").lstrip() -}}',
    '{%- elif m.role == "user" and "<image>" in m.content -%}{{- "<|im_start|>user\\n<|vision|>" + m.content.replace("<image>", "") -}}',
    '{%- else -%}{{- "<|im_start|>" + m.role + "\\n" + m.content -}}{%- endif -%}',
    '{{- "<|im_end|>\\n" -}}',
    '{%- endfor -%}',
    '{%- if add_generation_prompt -%}{{- "<|im_start|>assistant\\n" -}}{%- endif -%}',
  ].join(''),
);

/** Once any earlier assistant turn called a tool, the generation prompt reminds the model of the tools. */
const EARLIER_CALL_FLAG = new JinjaChatTemplate(
  [
    '{%- set ns = namespace(called=false) -%}',
    '{%- for m in messages -%}{%- if m.role == "assistant" and "<tool_call>" in m.content -%}{%- set ns.called = true -%}{%- endif -%}',
    '{{- "<|im_start|>" + m.role + "\\n" + m.content + "<|im_end|>\\n" -}}{%- endfor -%}',
    '{%- if add_generation_prompt -%}{{- "<|im_start|>assistant\\n" -}}{%- if ns.called -%}{{- "(tools used)\\n" -}}{%- endif -%}{%- endif -%}',
  ].join(''),
);

/** What each is probed: the opening it keeps, or not local at all. */
const TEMPLATES: { name: string; template: JinjaChatTemplate; local: Partial<SuffixLocality> }[] = [
  { name: 'a system-prompt flag (SmolLM3)', template: SYSTEM_FLAG, local: { local: true, opening: 'contents' } },
  { name: "the last user message's flag", template: LAST_QUERY_FLAG, local: { local: false } },
  { name: 'tool results and user messages by their contents', template: MESSAGE_FLAG, local: { local: true, opening: 'none' } },
  { name: "an earlier assistant turn's tool call", template: EARLIER_CALL_FLAG, local: { local: false } },
];

/** Contents with and without every flag these templates test, alone, embedded, or at either end. */
const flagged = fc.oneof(
  { weight: 2, arbitrary: hostileText },
  {
    weight: 3,
    arbitrary: fc
      .tuple(fc.constantFrom('', 'say ', 'a\n'), fc.constantFrom('/no_think', '/think', '/system_override', 'Error:', '<image>', '<tool_call>', '/no_think /system_override'), fc.constantFrom('', ' now', '\n'))
      .map(([a, flag, b]) => `${a}${flag}${b}`),
  },
);

describe.each(TEMPLATES)('a template that branches on $name', ({ template, local }) => {
  it(`is probed ${local.local ? `suffix-local, keeping the opening's ${local.opening === 'contents' ? 'contents' : 'nothing'}` : 'not suffix-local'}`, () => {
    expect(probeSuffixLocality(template, undefined)).toMatchObject(local);
    expect(probeSuffixLocality(template, [bashTool])).toMatchObject(local);
  });

  it('gives exactly the full-render delta incrementally, over random conversations with and without its flags', () => {
    const envRole = fc.constantFrom<ChatMessage['role']>('tool', 'tool', 'user', 'system');
    const env = fc.array(fc.record({ role: envRole, content: flagged }), { minLength: 1, maxLength: 3 });
    const conversation = fc.record({
      system: fc.option(flagged, { nil: undefined }),
      user: flagged,
      rounds: fc.array(fc.tuple(flagged, env), { maxLength: 3 }),
      last: flagged,
      added: env,
      tools: fc.boolean(),
    });
    let compared = 0;
    fc.assert(
      fc.property(conversation, ({ system, user, rounds, last, added, tools }) => {
        const schemas: readonly ToolSchema[] | undefined = tools ? [bashTool] : undefined;
        const tool = (m: ChatMessage): ChatMessage => (m.role === 'tool' ? { ...m, name: 'bash' } : m);
        const history: ChatMessage[] = [...(system === undefined ? [] : [{ role: 'system' as const, content: system }]), { role: 'user', content: user }];
        for (const [a, answer] of rounds) history.push({ role: 'assistant', content: a }, ...answer.map(tool));
        history.push({ role: 'assistant', content: last });
        const request = { history, added: added.map(tool), tools: schemas };
        const full = environmentDelta(template, { ...request, closing: probeAssistantClosing(template, schemas) });
        const locality = probeSuffixLocality(template, schemas);
        const incremental = locality.local ? suffixDelta(template, request, locality) : undefined;
        if (incremental === undefined || full.method !== 'anchor') return;
        compared++;
        expect(incremental).toEqual(full);
      }),
      { numRuns: 150 },
    );
    if (local.local) expect(compared).toBeGreaterThan(75);
  });

  it("fills a prompt from a skeleton only when that gives exactly the template's render", () => {
    const role = fc.constantFrom<ChatMessage['role']>('system', 'user', 'user', 'tool');
    const conversation = fc.record({
      messages: fc.array(fc.record({ role, content: flagged }), { minLength: 1, maxLength: 4 }),
      addGenerationPrompt: fc.boolean(),
    });
    fc.assert(
      fc.property(conversation, ({ messages, addGenerationPrompt }) => {
        const options = { addGenerationPrompt };
        const slots = contentSlots(messages);
        expect(renderWithSkeleton(template, messages, options, slots)).toBe(template.render(messages, options));
      }),
      { numRuns: 150 },
    );
  });
});

describe('the flags a template tests contents for', () => {
  it("are its string literals that are not plain output, then each joined to the next", () => {
    expect(contentFlags(MESSAGE_FLAG)).toEqual(['tool', 'Error:', 'user', '<image>', 'toolError:', 'Error:user', 'user<image>']);
    // Only output: "[" and "]" are pieces of `{{ ... }}` chains.
    expect(contentFlags(new JinjaChatTemplate('{% for m in messages %}{{ "[" + m.role + "]" + m.content }}{% endfor %}'))).toEqual([]);
    // A flag a statement keeps in a variable for a later test counts.
    expect(contentFlags(new JinjaChatTemplate('{% set f = "/x" %}{% for m in messages %}{{ m.content if f in m.content else "-" }}{% endfor %}'))).toEqual(['/x', '-', '/x-']);
  });

  it('keep a prompt with a flagged system message from being filled from the skeleton of a flag-free one', () => {
    const prompt = (system: string): ChatMessage[] => [{ role: 'system', content: system }, { role: 'user', content: 'u' }];
    const options = { addGenerationPrompt: true };
    expect(skeletonFor(SYSTEM_FLAG, prompt('s'), options, [0, 1])).toBeUndefined();
    const flaggedPrompt = prompt('Be brief. /no_think');
    expect(renderWithSkeleton(SYSTEM_FLAG, flaggedPrompt, options, [0, 1])).toBe(SYSTEM_FLAG.render(flaggedPrompt, options));
    expect(SYSTEM_FLAG.render(flaggedPrompt, options).endsWith('<|im_start|>assistant\n<think>\n\n</think>\n')).toBe(true);
  });
});
