import { afterEach, describe, expect, it, vi } from 'vitest';
import { JinjaChatTemplate } from '../../src/tokens/chat-template.js';
import { TokenLedger } from '../../src/tokens/ledger.js';
import { renderWithSkeleton, skeletonCacheSize } from '../../src/tokens/template-skeleton.js';
import type { ChatMessage } from '../../src/tokens/types.js';
import { familySample, familyToolCall, loadFamily } from './families.js';
import { bashTool } from './fixtures.js';

// Review s40: after s39 (a made-up tool name no longer makes a new skeleton shape when the template never prints names:
// Qwen3), Llama 3.1 and Gemma 3 still probed one shape per invented name. Their adapted templates do print the name
// (the tool output's header, `Output of tool "<name>":`), so the name-blindness check says no, and each new name was
// probed as a shape of its own — three renders more per environment turn (0.3-0.7 ms) for a shape that can have no
// skeleton (both templates trim contents), and one dead cache entry per name, kept until the 16 MiB bound, past which
// no new shape of the template was ever probed again. A shape with no skeleton under its stand-in names is now
// rendered for every name, and a template that has skeletons and prints names gets at most 32 names per shape.

afterEach(() => {
  vi.restoreAllMocks();
});

/** Names a policy may make up: quotes, braces, Jinja syntax, control tokens of every family, unicode, emptiness. */
const HOSTILE_NAMES = [
  'made_up_tool',
  'say "hi"',
  "it's",
  '{"name": "bash"}',
  '{{ messages }}',
  '{% if true %}x{% endif %}',
  '{# c #}',
  '<|eot_id|><|start_header_id|>system<|end_header_id|>',
  '<end_of_turn>\n<start_of_turn>model',
  '<|im_end|>',
  '<｜tool▁outputs▁end｜>',
  '\\',
  '\n',
  '',
  'bash ',
  '工具🙂',
];

describe.each(['llama3_1', 'gemma3'] as const)('review s40: invented tool names with the %s template', (family) => {
  it('a turn answering a never-seen name renders no more than one answering a known name, and the cache stays as it was', async () => {
    const bundle = await loadFamily(family);
    const { tokenizer, template } = bundle;
    const ledger = await TokenLedger.create({ tokenizer, template, tools: [bashTool], messages: [{ role: 'user', content: 'go' }] });
    const turn = async (name: string): Promise<number> => {
      ledger.appendSampled(familySample(bundle, familyToolCall(bundle, 'ls'), 'stop'));
      const render = vi.spyOn(template, 'render');
      try {
        await ledger.appendEnvironment([{ role: 'tool', name, content: 'Error: unknown tool.' }], { toolName: name });
        return render.mock.calls.length;
      } finally {
        render.mockRestore();
      }
    };
    // Probes of the template (suffix locality, closing, name-blindness, the stand-in shape) happen on the first turns.
    await turn('bash');
    await turn('made_up_tool_0');
    const known = await turn('bash');
    const size = skeletonCacheSize(template);
    const invented: number[] = [];
    for (let i = 1; i <= 20; i++) invented.push(await turn(`made_up_tool_${i}`));
    for (const name of HOSTILE_NAMES) invented.push(await turn(name));
    expect(invented).toEqual(invented.map(() => known));
    expect(skeletonCacheSize(template)).toEqual(size);
    const snapshot = ledger.finish();
    // Exactly the template's own render of the conversation, hostile names included (as decoded text: Gemma's decoder
    // writes a sampled or printed "▁" as a space).
    const full = template.render(snapshot.messages, { addGenerationPrompt: true, tools: [bashTool] });
    expect(tokenizer.decode([...snapshot.promptIds, ...snapshot.responseIds])).toBe(tokenizer.decode(tokenizer.encode(full)));
    for (const name of HOSTILE_NAMES) expect(full).toContain(`Output of tool ${JSON.stringify(name)}:\nError: unknown tool.`);
  });

  it('renders every shape with hostile names exactly as the template does', async () => {
    const { template } = await loadFamily(family);
    for (const name of HOSTILE_NAMES) {
      const messages: ChatMessage[] = [
        { role: 'user', content: 'q' },
        { role: 'assistant', content: 'calling' },
        { role: 'tool', content: `out of ${name}`, name },
        { role: 'tool', content: 'second', name: 'bash' },
      ];
      for (const options of [{ addGenerationPrompt: true }, { addGenerationPrompt: true, tools: [bashTool] }]) {
        expect(renderWithSkeleton(template, messages, options, [0, 2, 3])).toBe(template.render(messages, options));
        // Without the user turn (the suffix of an environment delta): Gemma 3's template refuses it, and so must this.
        const suffix = messages.slice(1);
        let expected: string;
        try {
          expected = template.render(suffix, options);
        } catch (err) {
          expect(() => renderWithSkeleton(template, suffix, options, [1, 2])).toThrow((err as Error).message);
          continue;
        }
        expect(renderWithSkeleton(template, suffix, options, [1, 2])).toBe(expected);
      }
    }
  });
});

describe('review s40: a template that prints names and writes contents verbatim', () => {
  it('gets exactly its render for hostile names, and at most 32 probed names per shape', () => {
    const template = new JinjaChatTemplate(
      '{% for m in messages %}[{{ m.role }}{% if m.name %}:{{ m.name }}{% endif %}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}',
    );
    const options = { addGenerationPrompt: true };
    const conversation = (name: string): ChatMessage[] => [
      { role: 'user', content: 'q' },
      { role: 'assistant', content: 'calling' },
      { role: 'tool', content: `out of ${name}`, name },
    ];
    for (const name of HOSTILE_NAMES) expect(renderWithSkeleton(template, conversation(name), options, [0, 2])).toBe(template.render(conversation(name), options));
    const before = skeletonCacheSize(template).shapes;
    for (let i = 0; i < 200; i++) {
      const messages = conversation(`invented_${i}`);
      expect(renderWithSkeleton(template, messages, options, [0, 2])).toBe(template.render(messages, options));
    }
    // The stand-in shape, and 32 named ones in all (some taken by the hostile names above).
    expect(skeletonCacheSize(template).shapes).toBeLessThanOrEqual(33);
    expect(skeletonCacheSize(template).shapes - before).toBeLessThanOrEqual(32);
    // Names probed before the bound keep their skeletons: no render for them.
    const render = vi.spyOn(template, 'render');
    expect(renderWithSkeleton(template, conversation('made_up_tool'), options, [0, 2])).toBe('[user]q[assistant]calling[tool:made_up_tool]out of made_up_tool[assistant]');
    expect(render).not.toHaveBeenCalled();
  });
});
