import { describe, expect, it } from 'vitest';
import { TokenLedger } from '../../src/tokens/ledger.js';
import { bashTool } from './fixtures.js';
import { familySample, familyToolCall, loadFamily, type Family } from './families.js';

/** Varied tool output (log lines, code, numbers, non-ASCII), `lines` lines, the same for the same seed. */
function toolOutput(seed: number, lines: number): string {
  const words = ['error', 'warning:', 'src/main.rs:42', 'fn', 'return', '{', '}', '0x7ffe', 'naïve', '数据', 'Ωmega', '🙂', '->', '==', '3.14159', 'TODO', 'passed', 'FAILED'];
  let x = seed;
  const out: string[] = [];
  for (let i = 0; i < lines; i++) {
    const line: string[] = [];
    for (let w = 0; w < 8; w++) {
      x = (x * 1103515245 + 12345) % 2 ** 31;
      line.push(words[x % words.length]!);
    }
    out.push(`${i}: ${line.join(' ')}`);
  }
  return out.join('\n');
}

// Qwen3's deltas are rendered from a suffix of the conversation, DeepSeek-V3's from all of it (not suffix-local).
describe.each<Family>(['qwen3', 'deepseek_v3'])('a %s conversation past 100K tokens', (family) => {
  it('has, after every environment turn, exactly the ids of a full re-render and tokenization of the conversation', async () => {
    const bundle = await loadFamily(family);
    const { tokenizer, template } = bundle;
    const ledger = await TokenLedger.create({ tokenizer, template, messages: [{ role: 'system', content: 'You are an agent.' }, { role: 'user', content: 'Fix the build.' }], tools: [bashTool] });
    for (let turn = 0; turn < 5; turn++) {
      ledger.appendSampled(familySample(bundle, `Step ${turn}.\n${familyToolCall(bundle, `make -k ${turn}`)}`, 'stop'));
      await ledger.appendEnvironment([{ role: 'tool', name: 'bash', content: toolOutput(turn + 1, 2_000) }]);
      const full = tokenizer.encode(template.render(ledger.snapshot().messages, { addGenerationPrompt: true, tools: [bashTool] }));
      expect([...ledger.contextIds()]).toEqual(full);
    }
    expect(ledger.totalTokens).toBeGreaterThan(100_000);
  }, 600_000);
});
