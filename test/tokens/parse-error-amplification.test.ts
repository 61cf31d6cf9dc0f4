import { expect, it } from 'vitest';
import { TokenLedger } from '../../src/tokens/ledger.js';
import { executeToolCalls } from '../../src/tools/execute.js';
import type { Sandbox } from '../../src/sandboxes/types.js';
import { bashTool } from './fixtures.js';
import { familySample, loadFamily } from './families.js';

/**
 * A degenerate completion of thousands of `<tool_call>` tokens and no closing tag: one parse error for all of them
 * (not one per tag, each re-scanning the text), so the observation the context then carries stays small. Found by
 * review (it was 2,000 errors and ~89K environment tokens).
 */
it('does not amplify a degenerate completion into tens of thousands of observation tokens', async () => {
  const b = await loadFamily('qwen3');
  const l = await TokenLedger.create({ tokenizer: b.tokenizer, template: b.template, messages: [{ role: 'user', content: 'U' }], tools: [bashTool] });
  const n = 2000;
  const text = l.appendSampled(familySample(b, '<tool_call>'.repeat(n), 'length'));
  const parsed = b.parser.parse(text);
  const obs = await executeToolCalls(parsed, [], { sandbox: {} as Sandbox, signal: new AbortController().signal });
  await l.appendEnvironment(obs.map((o) => ({ role: 'tool' as const, content: o.output, name: o.toolName })));
  const s = l.snapshot();
  const envTokens = s.responseIds.length - s.turns[0]!.end;
  expect(parsed.errors).toHaveLength(1);
  expect(obs).toHaveLength(1);
  expect(envTokens).toBeLessThan(200);
});
