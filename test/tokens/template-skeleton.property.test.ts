import fc from 'fast-check';
import { beforeAll, describe, expect, it } from 'vitest';
import { JinjaChatTemplate } from '../../src/tokens/chat-template.js';
import type { ModelBundle } from '../../src/tokens/model-bundle.js';
import { escapeMessage } from '../../src/tokens/opaque-content.js';
import { contentSlots, renderWithSkeleton, skeletonFor } from '../../src/tokens/template-skeleton.js';
import type { ChatMessage, ToolSchema } from '../../src/tokens/types.js';
import { bashTool, hostileText as text } from './fixtures.js';
import { FAMILIES, familyToolCall, loadFamily, type Family } from './families.js';

/**
 * Whether each family's first prompt ([system,] user) renders from a skeleton: Llama 3.1 and Gemma 3 trim contents,
 * so their prompts are always rendered; Qwen3 and DeepSeek-V3 write them verbatim.
 */
const PROMPT_SKELETON: Record<Family, boolean> = { qwen3: true, llama3_1: false, deepseek_v3: true, gemma3: false };


const render = (template: JinjaChatTemplate | ModelBundle['template'], messages: ChatMessage[], options: { addGenerationPrompt: boolean; tools?: readonly ToolSchema[] }): string | undefined => {
  try {
    return template.render(messages, options);
  } catch {
    return undefined; // a conversation the template refuses
  }
};

describe.each(FAMILIES)('render-free rendering with the %s template', (family) => {
  let bundle: ModelBundle;
  beforeAll(async () => {
    bundle = await loadFamily(family);
  });

  it(`${PROMPT_SKELETON[family] ? 'fills' : 'does not fill'} a first prompt from a skeleton`, () => {
    const prompt: ChatMessage[] = [{ role: 'system', content: 's' }, { role: 'user', content: 'u' }];
    for (const tools of [undefined, [bashTool]]) {
      const options = tools ? { addGenerationPrompt: true, tools } : { addGenerationPrompt: true };
      expect(skeletonFor(bundle.template, prompt, options, [0, 1]) !== undefined).toBe(PROMPT_SKELETON[family]);
    }
  });

  it('gives exactly the template\'s render for random conversations and hostile contents (assistant turns rendered, never filled)', () => {
    const role = fc.constantFrom<ChatMessage['role']>('system', 'user', 'user', 'tool', 'assistant');
    const conversation = fc.record({
      messages: fc.array(fc.record({ role, content: text, toolName: fc.constantFrom('bash', 'ls', undefined) }), { minLength: 1, maxLength: 5 }),
      tools: fc.boolean(),
      addGenerationPrompt: fc.boolean(),
    });
    let filled = 0;
    fc.assert(
      fc.property(conversation, ({ messages, tools, addGenerationPrompt }) => {
        const escaped = messages.map(({ role: r, content, toolName }): ChatMessage => {
          if (r === 'assistant') return { role: r, content: `${content}\n${familyToolCall(bundle, 'ls')}` };
          const m: ChatMessage = r === 'tool' && toolName !== undefined ? { role: r, content, name: toolName } : { role: r, content };
          return escapeMessage(bundle.tokenizer, m);
        });
        const options = tools ? { addGenerationPrompt, tools: [bashTool] } : { addGenerationPrompt };
        const expected = render(bundle.template, escaped, options);
        if (expected === undefined) return;
        const slots = contentSlots(escaped);
        if (skeletonFor(bundle.template, escaped, options, slots)) filled++;
        expect(renderWithSkeleton(bundle.template, escaped, options, slots)).toBe(expected);
      }),
      { numRuns: 200 },
    );
    if (PROMPT_SKELETON[family]) expect(filled).toBeGreaterThan(20);
  });
});

describe('the skeleton probe', () => {
  it('refuses shapes whose render depends on the contents, and fills those that do not', () => {
    const verbatim = new JinjaChatTemplate('{% for m in messages %}[{{ m.role }}]{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}');
    const trimming = new JinjaChatTemplate('{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}</s>{% endfor %}');
    const branching = new JinjaChatTemplate('{% for m in messages %}{% if m.content.startswith("<tool_response>") %}[wrapped]{% endif %}{{ m.content }}{% endfor %}');
    const twice = new JinjaChatTemplate('{% for m in messages %}{{ m.content }}|{{ m.content }}{% endfor %}');
    const counting = new JinjaChatTemplate('{% for m in messages %}{{ m.content | length }}:{{ m.content }}{% endfor %}');
    const reversed = new JinjaChatTemplate('{% for m in messages | reverse %}[{{ m.role }}]{{ m.content }}{% endfor %}');
    expect(skeletonFor(reversed, [{ role: 'system', content: 's' }, { role: 'user', content: 'u' }], { addGenerationPrompt: false }, [0, 1])).toBeUndefined();
    const messages: ChatMessage[] = [{ role: 'user', content: 'hello' }];
    const options = { addGenerationPrompt: true };
    expect(skeletonFor(verbatim, messages, options, [0])?.pieces).toEqual(['[user]', '</s>[assistant]']);
    for (const template of [trimming, branching, twice, counting]) expect(skeletonFor(template, messages, options, [0])).toBeUndefined();
    expect(renderWithSkeleton(trimming, [{ role: 'user', content: '  x ' }], options, [0])).toBe('[user]x</s>');
  });

  it('never makes an assistant message a slot', () => {
    const verbatim = new JinjaChatTemplate('{% for m in messages %}{{ m.content }}{% endfor %}');
    expect(skeletonFor(verbatim, [{ role: 'assistant', content: 'a' }], { addGenerationPrompt: false }, [0])).toBeUndefined();
  });
});
