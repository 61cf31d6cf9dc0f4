import { afterEach, describe, expect, it, vi } from 'vitest';
import { JinjaChatTemplate } from '../../src/tokens/chat-template.js';
import { TokenLedger } from '../../src/tokens/ledger.js';
import { renderWithSkeleton } from '../../src/tokens/template-skeleton.js';
import type { ChatMessage } from '../../src/tokens/types.js';
import { familySample, familyToolCall, loadFamily } from './families.js';
import { bashTool } from './fixtures.js';

// Review s39: a tool message's name is part of a skeleton's shape (template-skeleton.ts), and after a call to a tool
// that does not exist it is the name the policy made up. Each new name was a new shape, probed with ~80 renders on the
// event loop (Qwen3: 3.3 ms per environment turn against 0.01 ms, for a template that does not even print names), and
// kept in the template's skeleton cache: a policy that invents tool names (common early in RL) made every turn pay it.

afterEach(() => {
  vi.restoreAllMocks();
});

describe('review s39: invented tool names and the skeleton cache', () => {
  it('qwen3: a turn answering a never-seen tool name renders the template no more than one answering a known name', async () => {
    const bundle = await loadFamily('qwen3');
    const { tokenizer, template } = bundle;
    const ledger = await TokenLedger.create({ tokenizer, template, tools: [bashTool], messages: [{ role: 'user', content: 'go' }] });
    const turn = async (name: string): Promise<number> => {
      ledger.appendSampled(familySample(bundle, familyToolCall(bundle, 'ls'), 'stop'));
      const render = vi.spyOn(template, 'render');
      try {
        await ledger.appendEnvironment([{ role: 'tool', name, content: `Error: unknown tool "${name}".` }], { toolName: name });
        return render.mock.calls.length;
      } finally {
        render.mockRestore();
      }
    };
    // Probes of the template (suffix locality, closing, the shape) happen on the first turns.
    await turn('bash');
    await turn('made_up_tool_0');
    const known = await turn('bash');
    const invented = [await turn('made_up_tool_1'), await turn('another invented name'), await turn('made_up_tool_2')];
    expect(invented).toEqual([known, known, known]);
    const snapshot = ledger.finish();
    // Exactly the template's own render of the conversation (the ledger's record of it).
    const full = template.render(snapshot.messages, { addGenerationPrompt: true, tools: [bashTool] });
    expect(tokenizer.decode([...snapshot.promptIds, ...snapshot.responseIds])).toBe(full);
  });

  it('a template that prints or tests names still gets exactly its render for every name', () => {
    const templates = [
      '{% for m in messages %}[{{ m.role }}{% if m.name %}:{{ m.name }}{% endif %}]{{ m.content }}{% endfor %}',
      "{% for m in messages %}{% if m.name == 'python' %}[py]{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}",
      '{% for m in messages %}{% if m.name %}[named]{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}',
      '{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}',
    ].map((source) => new JinjaChatTemplate(source));
    const options = { addGenerationPrompt: true };
    for (const template of templates) {
      for (const name of ['bash', 'python', '', 'x y', 'bash']) {
        const messages: ChatMessage[] = [
          { role: 'user', content: 'q' },
          { role: 'assistant', content: 'calling' },
          { role: 'tool', content: `out of ${name}`, name },
          { role: 'tool', content: 'second', name: 'python' },
        ];
        expect(renderWithSkeleton(template, messages, options, [0, 2, 3])).toBe(template.render(messages, options));
      }
    }
  });
});
