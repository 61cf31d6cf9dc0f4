import { beforeAll, describe, expect, it } from 'vitest';
import { JinjaChatTemplate } from '../../src/tokens/chat-template.js';
import { loadQwen3 } from '../../src/tokens/tokenizer.js';
import type { ChatMessage, ChatTemplate } from '../../src/tokens/types.js';
import { bashTool, toolCallText } from './fixtures.js';

let qwen: ChatTemplate;
beforeAll(async () => {
  ({ template: qwen } = await loadQwen3());
});

/** The Qwen3 tools preamble, verbatim from the reference format (tool JSON with Python's json.dumps spacing). */
const QWEN_TOOLS_SYSTEM =
  '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' +
  'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n' +
  '{"type": "function", "function": {"name": "bash", "description": "Run a \\"bash\\" command — returns stdout", ' +
  '"parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}\n</tools>\n\n' +
  'For each function call, return a json object with function name and arguments within <tool_call></tool_call> ' +
  'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>';

const agentConversation: ChatMessage[] = [
  { role: 'system', content: 'You are an agent.' },
  { role: 'user', content: 'List the files.' },
  { role: 'assistant', content: `I will look.\n${toolCallText('ls')}` },
  { role: 'tool', name: 'bash', content: 'a.txt\nb.txt' },
  { role: 'tool', name: 'bash', content: 'exit 0' },
  { role: 'assistant', content: 'Two files.' },
  { role: 'user', content: 'Thanks' },
];

describe('Qwen3 chat template', () => {
  it('renders system, user, assistant with a tool call, tool responses and tools in the reference format', () => {
    expect(qwen.render(agentConversation, { addGenerationPrompt: true, tools: [bashTool] })).toBe(
      `<|im_start|>system\nYou are an agent.\n\n${QWEN_TOOLS_SYSTEM}<|im_end|>\n` +
        '<|im_start|>user\nList the files.<|im_end|>\n' +
        `<|im_start|>assistant\nI will look.\n${toolCallText('ls')}<|im_end|>\n` +
        '<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response>\n<tool_response>\nexit 0\n</tool_response><|im_end|>\n' +
        '<|im_start|>assistant\nTwo files.<|im_end|>\n' +
        '<|im_start|>user\nThanks<|im_end|>\n' +
        '<|im_start|>assistant\n',
    );
  });

  it('writes the system message alone when there are no tools', () => {
    const text = qwen.render(agentConversation.slice(0, 2), { addGenerationPrompt: false, tools: [] });
    expect(text).toBe('<|im_start|>system\nYou are an agent.<|im_end|>\n<|im_start|>user\nList the files.<|im_end|>\n');
  });

  it('writes a tools-only system block when the conversation has no system message', () => {
    const text = qwen.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: true, tools: [bashTool] });
    expect(text).toBe(`<|im_start|>system\n${QWEN_TOOLS_SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n`);
  });

  it('gives the final assistant message an empty think block, but not earlier ones', () => {
    const text = qwen.render(agentConversation.slice(0, 6), { addGenerationPrompt: false });
    expect(text).toContain(`<|im_start|>assistant\nI will look.\n<tool_call>`);
    expect(text.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\nTwo files.<|im_end|>\n')).toBe(true);
  });

  it('keeps reasoning after the last user query and drops it before', () => {
    const thinking: ChatMessage[] = [
      { role: 'user', content: 'Q1' },
      { role: 'assistant', content: `<think>\nplan\n</think>\n\n${toolCallText('ls')}` },
      { role: 'tool', content: 'a.txt' },
    ];
    const inTurn = qwen.render(thinking, { addGenerationPrompt: true });
    expect(inTurn).toContain(`<|im_start|>assistant\n<think>\nplan\n</think>\n\n${toolCallText('ls')}<|im_end|>`);
    const afterNewQuery = qwen.render([...thinking, { role: 'user', content: 'Q2' }], { addGenerationPrompt: true });
    expect(afterNewQuery).toContain(`<|im_start|>assistant\n${toolCallText('ls')}<|im_end|>`);
    expect(afterNewQuery).not.toContain('plan');
  });

  it('passes extra variables such as enable_thinking', async () => {
    const { template } = await loadQwen3({ enable_thinking: false });
    const text = template.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: true });
    expect(text.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\n')).toBe(true);
  });
});

describe('JinjaChatTemplate', () => {
  it('exposes the special tokens of the config', () => {
    const template = JinjaChatTemplate.fromConfig(
      { bos_token: '<s>', eos_token: { content: '</s>' }, unk_token: null },
      '{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}[{{ unk_token }}]',
    );
    expect(template.render([{ role: 'user', content: 'x' }], { addGenerationPrompt: false })).toBe('<s>x</s>[]');
  });

  it('passes tools as none when there are none, and name only when given', () => {
    const template = new JinjaChatTemplate(
      '{{ tools is none }}{% for m in messages %}|{{ m.name is defined }}{% endfor %}',
    );
    const messages: ChatMessage[] = [{ role: 'tool', content: 'x', name: 'bash' }, { role: 'user', content: 'y' }];
    expect(template.render(messages, { addGenerationPrompt: false })).toBe('true|true|false');
  });

  it('turns raise_exception into an invalid_argument error', () => {
    const template = new JinjaChatTemplate("{{ raise_exception('roles must alternate') }}");
    expect(() => template.render([], { addGenerationPrompt: false })).toThrow(
      expect.objectContaining({ code: 'invalid_argument', message: expect.stringContaining('roles must alternate') }),
    );
  });

  it('refuses a template that does not parse', () => {
    expect(() => new JinjaChatTemplate('{% for %}')).toThrow(expect.objectContaining({ code: 'failed_precondition' }));
  });
});
