import { copyFile, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TokenLedger } from '../../src/tokens/ledger.js';
import { loadModelBundle, type ModelBundle } from '../../src/tokens/model-bundle.js';
import { qwen3ModelDir } from '../../src/tokens/tokenizer.js';
import { canonicalSample, toolCallText } from '../tokens/fixtures.js';

/**
 * A ChatML template that branches on a content's length (caps tool results and user messages at 64 characters):
 * the decision depends on no string literal, so neither the skeleton probe nor the suffix-locality probe can see it.
 */
const CAPPING = [
  '{%- for m in messages -%}',
  '{%- if m.role == "tool" -%}{{- "<|im_start|>user\\n<tool_response>\\n" + (m.content if m.content|length <= 64 else m.content[:64] + "...[truncated]") + "\\n</tool_response><|im_end|>\\n" -}}',
  '{%- elif m.role == "user" -%}{{- "<|im_start|>user\\n" + (m.content if m.content|length <= 64 else m.content[:64] + "...[truncated]") + "<|im_end|>\\n" -}}',
  '{%- else -%}{{- "<|im_start|>" + m.role + "\\n" + m.content + "<|im_end|>\\n" -}}{%- endif -%}',
  '{%- endfor -%}',
  '{%- if add_generation_prompt -%}{{- "<|im_start|>assistant\\n" -}}{%- endif -%}',
].join('');

let dir: string;
let bundle: ModelBundle;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'length-template-'));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) await copyFile(join(qwen3ModelDir(), f), join(dir, f));
  await writeFile(join(dir, 'chat_template.jinja'), CAPPING);
  bundle = await loadModelBundle({ dir, toolCallParser: 'hermes' });
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

// Regression (tokens review, 2026-12-02): the skeleton and suffix-locality probes tried only short contents, so a
// template that caps or branches on a content's length (no string literal reveals it) was taken as writing contents
// verbatim: prompts and observations went into the context in full where the template cut them.
describe('a template whose output depends on a content\'s length', () => {
  const long = 'x'.repeat(50) + ' and then a long tail of tool output that the template caps';

  it('gets the first prompt the template renders', () => {
    const { tokenizer, template } = bundle;
    const messages = [{ role: 'system' as const, content: 'sys' }, { role: 'user' as const, content: long }];
    const ledger = new TokenLedger({ tokenizer, template, messages });
    expect(tokenizer.decode([...ledger.promptIds])).toBe(template.render(messages, { addGenerationPrompt: true }));
  });

  it('gets the tool observation the template renders', async () => {
    const { tokenizer, template } = bundle;
    const messages = [{ role: 'system' as const, content: 'sys' }, { role: 'user' as const, content: 'go' }];
    const ledger = new TokenLedger({ tokenizer, template, messages });
    ledger.appendSampled(canonicalSample(tokenizer, toolCallText('cat f'), 'stop'));
    await ledger.appendEnvironment([{ role: 'tool', name: 'bash', content: long }]);
    const snap = ledger.snapshot();
    expect(tokenizer.decode([...ledger.contextIds()])).toBe(template.render(snap.messages, { addGenerationPrompt: true }));
  });
});
