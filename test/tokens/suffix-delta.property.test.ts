import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { JinjaChatTemplate } from '../../src/tokens/chat-template.js';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import { escapeMessage } from '../../src/tokens/opaque-content.js';
import { probeSuffixLocality, suffixDelta, type SuffixLocality } from '../../src/tokens/suffix-delta.js';
import { environmentDelta, probeAssistantClosing } from '../../src/tokens/template-delta.js';
import type { ChatMessage, ToolSchema } from '../../src/tokens/types.js';
import { bashTool, hostileText as text } from './fixtures.js';
import { FAMILIES, familyToolCall, loadFamily, type Family } from './families.js';

/** What the probe finds for each family we ship (DeepSeek-V3 opens the first tool output of a whole conversation differently). */
const LOCAL: Record<Family, boolean> = { qwen3: true, llama3_1: true, deepseek_v3: false, gemma3: true };
/**
 * What the local ones keep before the assistant turn: nothing, or (Gemma 3's alternation) the opening's roles. None
 * needs the opening's real contents, though their probes try every flag their templates test contents for.
 */
const OPENING: Partial<Record<Family, SuffixLocality['opening']>> = { qwen3: 'none', llama3_1: 'none', gemma3: 'roles' };


describe.each(FAMILIES)('incremental rendering with the %s template', (family) => {
  let bundle: ModelBundle;
  beforeAll(async () => {
    bundle = await loadFamily(family);
  });

  it(`is probed ${LOCAL[family] ? 'suffix-local' : 'not suffix-local'}, with and without tools`, () => {
    expect(probeSuffixLocality(bundle.template, undefined).local).toBe(LOCAL[family]);
    expect(probeSuffixLocality(bundle.template, [bashTool]).local).toBe(LOCAL[family]);
    // Every family we ship writes the same text after an assistant turn whatever it holds: no render per delta.
    expect(probeSuffixLocality(bundle.template, [bashTool]).verify).toBe(!LOCAL[family]);
    if (LOCAL[family]) {
      expect(probeSuffixLocality(bundle.template, undefined)).toMatchObject({ opening: OPENING[family], tools: false });
      expect(probeSuffixLocality(bundle.template, [bashTool])).toMatchObject({ opening: OPENING[family], tools: false });
    }
  });

  it('renders exactly the full-render delta from a suffix, over random conversations and hostile contents', () => {
    const envRole = fc.constantFrom<ChatMessage['role']>('tool', 'tool', 'user', 'system');
    const env = fc.array(fc.record({ role: envRole, content: text }), { minLength: 1, maxLength: 3 });
    const assistant = fc.oneof(text, text.map((t) => `${t}\n${familyToolCall(bundle, 'ls')}`));
    const conversation = fc.record({
      system: fc.option(text, { nil: undefined }),
      user: text,
      rounds: fc.array(fc.tuple(assistant, env), { maxLength: 4 }),
      last: assistant,
      added: env,
      tools: fc.boolean(),
    });
    let compared = 0;
    fc.assert(
      fc.property(conversation, ({ system, user, rounds, last, added, tools }) => {
        const schemas: readonly ToolSchema[] | undefined = tools ? [bashTool] : undefined;
        // As the ledger keeps them: environment contents escaped, sampled text as is.
        const escape = (m: ChatMessage): ChatMessage => escapeMessage(bundle.tokenizer, m);
        const history: ChatMessage[] = [...(system === undefined ? [] : [escape({ role: 'system', content: system })]), escape({ role: 'user', content: user })];
        for (const [a, answer] of rounds) history.push({ role: 'assistant', content: a }, ...answer.map(escape));
        history.push({ role: 'assistant', content: last });
        const request = { history, added: added.map(escape), tools: schemas };
        let full;
        try {
          full = environmentDelta(bundle.template, { ...request, closing: probeAssistantClosing(bundle.template, schemas) });
        } catch {
          return; // a conversation the template refuses (the ledger refuses it too)
        }
        const locality = probeSuffixLocality(bundle.template, schemas);
        const incremental = locality.local ? suffixDelta(bundle.template, request, locality) : undefined;
        // The full render falls back from the anchor only when an earlier sampled turn spells the probe marker itself
        // (a second anchor); the suffix does not hold that turn. Otherwise the two must agree exactly.
        if (incremental === undefined || full.method !== 'anchor') return;
        compared++;
        expect(incremental).toEqual(full);
      }),
      { numRuns: 150 },
    );
    if (LOCAL[family]) expect(compared).toBeGreaterThan(75);
  });
});

describe('the locality probe', () => {
  it('refuses a template whose text after an assistant turn depends on earlier turns', () => {
    // Numbers the tool results of the whole conversation, like DeepSeek-V3 opening only the first one.
    const counting = new JinjaChatTemplate(
      '{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == "tool" %}{% set ns.n = ns.n + 1 %}[tool {{ ns.n }}]{% else %}[{{ m.role }}]{% endif %}' +
        '{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}',
    );
    expect(probeSuffixLocality(counting, undefined).local).toBe(false);
  });

  it('keeps what a template needs before the assistant turn, and the tools only when they change the delta', () => {
    // Tool results are headed with the number of tools: the tools matter after the assistant turn.
    const toolCount = new JinjaChatTemplate(
      '{% for m in messages %}[{{ m.role }}{% if m.role == "tool" %} of {{ tools | length if tools else 0 }}{% endif %}]{{ m.content }}</s>{% endfor %}' +
        '{% if add_generation_prompt %}[assistant]{% endif %}',
    );
    expect(probeSuffixLocality(toolCount, [bashTool])).toEqual({ local: true, opening: 'none', tools: true, verify: false });
    expect(probeSuffixLocality(toolCount, undefined)).toEqual({ local: true, opening: 'none', tools: false, verify: false });
  });

  it('keeps checking each delta against a real render when the text after an assistant turn depends on its content', () => {
    // Heads a tool result differently when the turn before it holds a tool call: the delta depends on what was sampled.
    const byContent = new JinjaChatTemplate(
      '{% for m in messages %}{% if m.role == "tool" and "<tool_call>" in messages[loop.index0 - 1].content %}[reply]{% else %}[{{ m.role }}]{% endif %}' +
        '{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}',
    );
    const locality = probeSuffixLocality(byContent, undefined);
    expect(locality).toMatchObject({ local: true, verify: true });
    const added: ChatMessage[] = [{ role: 'tool', content: 'out', name: 'bash' }];
    for (const last of ['plain answer', '<tool_call>\n{"name": "bash"}\n</tool_call>']) {
      const request = { history: [{ role: 'user', content: 'q' }, { role: 'assistant', content: last }] satisfies ChatMessage[], added, tools: undefined };
      const full = environmentDelta(byContent, { ...request, closing: probeAssistantClosing(byContent, undefined) });
      // Either the checked suffix gives the full render's text, or it declines and the full render is used.
      const incremental = suffixDelta(byContent, request, locality);
      if (incremental !== undefined) expect(incremental).toEqual(full);
      // Trusting the marker's tail would have been wrong for one of them: that is what the check is for.
      expect(suffixDelta(byContent, request, { ...locality, verify: false })?.text === full.text).toBe(last === 'plain answer');
    }
  });
});
