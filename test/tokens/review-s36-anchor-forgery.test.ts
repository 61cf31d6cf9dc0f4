import { describe, expect, it } from 'vitest';
import { TokenLedger } from '../../src/tokens/ledger.js';
import { PROBE_ASSISTANT } from '../../src/tokens/template-delta.js';
import { familySample, loadFamily } from './families.js';

// Review s36 (the flaw class of item 5, reached by the policy): environmentDelta anchors on a marker put in place of the
// last assistant content and requires it to be unique in the render. Environment contents are escaped so they cannot
// hold it, but earlier assistant contents are the policy's own text, rendered as sampled: a model that writes the
// marker's characters in one turn made every later delta of a template that is not suffix-local (DeepSeek-V3) miss
// its anchor and fall back — to the isolated render (<｜begin▁of▁sentence｜> mid-trajectory) or, refused, to a failed
// trajectory. The delta must be the same as for any other text.

describe('review s36: the delta anchor and a policy that writes it', () => {
  it('deepseek_v3: a turn holding the anchor marker changes no later delta', async () => {
    const bundle = await loadFamily('deepseek_v3');
    const { tokenizer, template } = bundle;
    const run = async (firstText: string): Promise<{ env2: number[]; methods: Record<string, number> }> => {
      const ledger = new TokenLedger({ tokenizer, template, messages: [{ role: 'user', content: 'go' }] });
      ledger.appendSampled(familySample(bundle, firstText, 'stop'));
      await ledger.appendEnvironment([{ role: 'user', content: 'next' }]);
      ledger.appendSampled(familySample(bundle, 'second turn', 'stop'));
      await ledger.appendEnvironment([{ role: 'user', content: 'again' }]);
      const snapshot = ledger.finish();
      const last = snapshot.turns.at(-1)!;
      return { env2: snapshot.responseIds.slice(last.start, last.end), methods: { ...ledger.deltaMethods } };
    };
    const plain = await run('first turn');
    const forged = await run(`first ${PROBE_ASSISTANT} turn`);
    expect(forged.env2).toEqual(plain.env2);
    expect(forged.methods).toEqual(plain.methods);
  });
});
