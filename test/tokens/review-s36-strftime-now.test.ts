import { afterEach, describe, expect, it, vi } from 'vitest';
import { JinjaChatTemplate } from '../../src/tokens/chat-template.js';
import { contentSlots, renderWithSkeleton } from '../../src/tokens/template-skeleton.js';
import type { ChatMessage } from '../../src/tokens/types.js';

// Review s36, item 4: a template that prints today's date (strftime_now, as Llama 3.2/3.3 and SmolLM3 templates do)
// must render the same through the skeleton cache as uncached. Decision: a template's strftime_now() reports one fixed
// time — the server's template clock, set once per process and handed to its token threads — so every render of a
// template is the same function of its arguments (which the ledger's render diffs and every cache of renders rely on),
// and no trajectory sees the date change between its renders.

const SOURCE = `{{ 'Today: ' + strftime_now('%d %b %Y') + '\\n' }}{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}`;

afterEach(() => {
  vi.useRealTimers();
});

describe('review s36: strftime_now and the skeleton cache', () => {
  it('a render through a skeleton cached days earlier equals the uncached render', () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    vi.setSystemTime(new Date(2026, 0, 10, 12));
    const template = new JinjaChatTemplate(SOURCE);
    const messages: ChatMessage[] = [{ role: 'user', content: 'what day is it?' }];
    const options = { addGenerationPrompt: true };
    const first = renderWithSkeleton(template, messages, options, contentSlots(messages));
    expect(first).toBe(template.render(messages, options));
    vi.setSystemTime(new Date(2026, 0, 13, 12));
    const later: ChatMessage[] = [{ role: 'user', content: 'and now?' }];
    expect(renderWithSkeleton(template, later, options, contentSlots(later))).toBe(template.render(later, options));
  });

  it('every render of a template prints one date, whenever it runs (renders are pure)', () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    vi.setSystemTime(new Date(2026, 5, 1, 23, 59));
    const template = new JinjaChatTemplate(SOURCE);
    const messages: ChatMessage[] = [{ role: 'user', content: 'hi' }];
    const before = template.render(messages, { addGenerationPrompt: true });
    vi.setSystemTime(new Date(2026, 5, 2, 0, 1));
    expect(template.render(messages, { addGenerationPrompt: true })).toBe(before);
    expect(new JinjaChatTemplate(SOURCE).render(messages, { addGenerationPrompt: true })).toBe(before);
  });
});
