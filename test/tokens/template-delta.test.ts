import { beforeAll, describe, expect, it } from 'vitest';
import { JinjaChatTemplate } from '../../src/tokens/chat-template.js';
import { environmentDelta, probeAssistantClosing } from '../../src/tokens/template-delta.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { ChatMessage, ChatTemplate } from '../../src/tokens/types.js';
import { bashTool } from './fixtures.js';

let qwen: ChatTemplate;
beforeAll(async () => {
  ({ template: qwen } = await loadQwen3());
});

const history: ChatMessage[] = [
  { role: 'user', content: 'Q' },
  { role: 'assistant', content: 'A' },
];
const toolReply: ChatMessage[] = [{ role: 'tool', content: 'R' }];

/** A plain template that renders every turn the same wherever it is: render(history) is always a prefix. */
const plain = new JinjaChatTemplate(
  '{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}\n{% endfor %}' +
    '{% if add_generation_prompt %}[assistant]{% endif %}',
  { specialTokens: { eos_token: '</s>' } },
);

describe('probeAssistantClosing', () => {
  it('finds what the template writes after assistant content', () => {
    expect(probeAssistantClosing(qwen, [bashTool])).toBe('<|im_end|>\n');
    expect(probeAssistantClosing(plain, undefined)).toBe('</s>\n');
  });
});

describe('environmentDelta', () => {
  it('finds the text after the assistant content by anchoring on it, when the template renders turns alike', () => {
    const delta = environmentDelta(plain, { history, added: toolReply, tools: undefined, closing: '</s>\n' });
    expect(delta).toEqual({ text: '</s>\n[tool]R</s>\n[assistant]', method: 'anchor' });
  });

  it('diffs the renders when the anchor cannot be found but the history render is a prefix of the full render', () => {
    // Rewrites assistant content (upper-cases it), so the probe marker never appears verbatim.
    const shouting: ChatTemplate = {
      render: (messages, { addGenerationPrompt }) =>
        messages.map((m) => `[${m.role}]${m.role === 'assistant' ? m.content.toUpperCase() : m.content}</s>\n`).join('') +
        (addGenerationPrompt ? '[assistant]' : ''),
    };
    const closing = probeAssistantClosing(shouting, undefined);
    expect(closing).toBe('');
    const delta = environmentDelta(shouting, { history, added: toolReply, tools: undefined, closing });
    expect(delta).toEqual({ text: '[tool]R</s>\n[assistant]', method: 'prefix' });
  });

  it('anchors on the assistant content when Qwen3 renders the last assistant turn differently', () => {
    const delta = environmentDelta(qwen, { history, added: toolReply, tools: [bashTool], closing: '<|im_end|>\n' });
    expect(delta).toEqual({
      text: '<|im_end|>\n<|im_start|>user\n<tool_response>\nR\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
      method: 'anchor',
    });
  });

  it('refuses, as a last resort, when even the text after the content changes and the messages alone are not the render\u2019s tail', () => {
    const chars = (ms: readonly ChatMessage[]): number => ms.reduce((n, m) => n + m.content.length, 0);
    const rewriting: ChatTemplate = {
      render: (messages, { addGenerationPrompt }) =>
        `#${messages.length}\n` +
        messages.map((m) => `<${m.role}>${m.content}</${m.role}>`).join('') +
        (addGenerationPrompt ? `<assistant after=${chars(messages)}>` : ''),
    };
    // Rendered alone, the reply was '#1\n<tool>R</tool><assistant after=1>': a header and a count no render of the
    // conversation holds (it ends '<tool>R</tool><assistant after=N>' for the whole conversation's N). Review s36 item 5.
    expect(() => environmentDelta(rewriting, { history, added: toolReply, tools: undefined, closing: '</assistant>' })).toThrow(
      expect.objectContaining({ code: 'failed_precondition' }),
    );
  });

  it('refuses environment messages that do not follow an assistant turn', () => {
    expect(() =>
      environmentDelta(plain, { history: history.slice(0, 1), added: toolReply, tools: undefined, closing: '' }),
    ).toThrow(expect.objectContaining({ code: 'failed_precondition' }));
  });
});
