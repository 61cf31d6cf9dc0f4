import { describe, it } from 'vitest';
import { FAMILIES, loadFamily } from '../tokens/families.js';

describe('explore', () => {
  it.each(FAMILIES)('%s', async (family) => {
    const b = await loadFamily(family);
    console.log(family, JSON.stringify(b.profile), b.parser.name, 'stop', b.tokenizer.stopTokenIds.map((i) => b.tokenizer.decode([i])));
    const msgs = [
      { role: 'user' as const, content: 'q' },
      { role: 'assistant' as const, content: 'a' },
      { role: 'tool' as const, content: 'OUT', name: 'NAME<x>' },
    ];
    console.log(JSON.stringify(b.template.render(msgs, { addGenerationPrompt: true })));
    console.log(JSON.stringify(b.template.inner.render(msgs as any, { addGenerationPrompt: true })).slice(0, 600));
  });
});
