import { describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { JinjaChatTemplate } from '../../src/tokens/chat-template.js';
import { environmentDelta, probeAssistantClosing } from '../../src/tokens/template-delta.js';
import type { ChatMessage } from '../../src/tokens/types.js';
import { FAMILIES, loadFamily } from './families.js';

// Review s36, item 5: environmentDelta's last resort ("isolated") rendered the new messages on their own — a render
// that opens a conversation, so a template writing <bos> (Gemma, Llama) or a default system block (Llama 3.1) put
// those in the middle of the trajectory. No shipped family reaches it (first test); a template that does (one that
// rewrites assistant contents and closes a conversation differently at its end) must get the in-context delta or a
// refusal, never wrong tokens.

const history: ChatMessage[] = [
  { role: 'user', content: 'list the files' },
  { role: 'assistant', content: 'calling ls' },
];
const added: ChatMessage[] = [{ role: 'user', content: 'a.txt b.txt' }];

/** Gemma-like, with <bos>: assistant contents upper-cased (no anchor), <eos> only at the end of a whole render (no prefix). */
const GEMMA_LIKE = new JinjaChatTemplate(
  `{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n{{ (m.content | upper) if m.role == 'assistant' else m.content }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% else %}<eos>{% endif %}`,
  { specialTokens: { bos_token: '<bos>', eos_token: '<eos>' } },
);

describe('review s36: the isolated fallback of environmentDelta', () => {
  for (const family of FAMILIES) {
    it(`${family}: never reaches it`, async () => {
      const { template } = await loadFamily(family);
      const delta = environmentDelta(template, { history, added, tools: undefined, closing: probeAssistantClosing(template, undefined) });
      expect(delta.method).not.toBe('isolated');
    });
  }

  it('a template that does reach it: the delta is the whole render\u2019s tail, or the ledger refuses (no <bos> mid-trajectory)', () => {
    const full = GEMMA_LIKE.render([...history, ...added], { addGenerationPrompt: true });
    let delta: ReturnType<typeof environmentDelta> | undefined;
    try {
      delta = environmentDelta(GEMMA_LIKE, { history, added, tools: undefined, closing: probeAssistantClosing(GEMMA_LIKE, undefined) });
    } catch (err) {
      expect(err).toBeInstanceOf(RolloutError);
      expect((err as RolloutError).code).toBe('failed_precondition');
      return;
    }
    expect(delta.text).not.toContain('<bos>');
    expect(full.endsWith(delta.text)).toBe(true);
  });

  it('a template that reaches it with a sound tail (no <bos> of its own) still gets the whole render\u2019s tail', () => {
    // Upper-cases an assistant content unless it is the last message: no anchor (the marker is rewritten in context),
    // no prefix (the history alone renders it as is), but the closing probe (assistant last) finds "<end_of_turn>\n".
    const template = new JinjaChatTemplate(
      `{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n{{ (m.content | upper) if (m.role == 'assistant' and not loop.last) else m.content }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}`,
    );
    const closing = probeAssistantClosing(template, undefined);
    expect(closing).toBe('<end_of_turn>\n');
    const delta = environmentDelta(template, { history, added, tools: undefined, closing });
    expect(delta).toEqual({ text: '<end_of_turn>\n<start_of_turn>user\na.txt b.txt<end_of_turn>\n<start_of_turn>model\n', method: 'isolated' });
    expect(template.render([...history, ...added], { addGenerationPrompt: true }).endsWith(delta.text)).toBe(true);
  });
});
