import { copyFile, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { TokenLedger } from '../../src/tokens/ledger.js';
import { loadModelBundle } from '../../src/tokens/model-bundle.js';
import { bashTool } from './fixtures.js';
import { FAMILIES, familyDir, familySample, familyToolCall, loadFamily, type Family } from './families.js';

/** What each family's folder is found to be: per-family facts the README's "Models" section states. */
const EXPECTED: Record<Family, { parser: string; toolRole: boolean; rendersTools: boolean; alternates: boolean; stops: string[] }> = {
  qwen3: { parser: 'hermes', toolRole: true, rendersTools: true, alternates: false, stops: ['<|im_end|>', '<|endoftext|>'] },
  llama3_1: { parser: 'llama3_json', toolRole: false, rendersTools: false, alternates: false, stops: ['<|eot_id|>', '<|end_of_text|>'] },
  deepseek_v3: { parser: 'deepseek_v3', toolRole: true, rendersTools: false, alternates: false, stops: ['<｜end▁of▁sentence｜>'] },
  gemma3: { parser: 'hermes', toolRole: false, rendersTools: false, alternates: true, stops: ['<end_of_turn>', '<eos>'] },
};

describe.each(FAMILIES)('the %s model folder', (family) => {
  it('is probed for its tool role, tool schemas, alternation, stop tokens and tool-call format', async () => {
    const bundle = await loadFamily(family);
    const expected = EXPECTED[family];
    expect(bundle.parser.name).toBe(expected.parser);
    expect(bundle.parserSource).toBe('detected');
    expect(bundle.profile).toMatchObject({ toolRole: expected.toolRole, rendersTools: expected.rendersTools, alternates: expected.alternates });
    expect(bundle.tokenizer.stopTokenIds.map((id) => bundle.tokenizer.decode([id]))).toEqual(expected.stops);
  });

  it('runs a multi-turn tool conversation: sampled ids verbatim, calls parsed back, observations in the accepted role', async () => {
    const bundle = await loadFamily(family);
    const { tokenizer, template, parser } = bundle;
    const ledger = new TokenLedger({ tokenizer, template, messages: [{ role: 'system', content: 'Solve it.' }, { role: 'user', content: 'What is 2 + 3?' }], tools: [bashTool] });
    const first = familySample(bundle, familyToolCall(bundle, 'echo $((2+3))'), 'stop', 3);
    expect(parser.parse(ledger.appendSampled(first))).toEqual({ calls: [{ name: 'bash', arguments: { cmd: 'echo $((2+3))' } }], errors: [] });
    await ledger.appendEnvironment([{ role: 'tool', name: 'bash', content: '5' }], { toolName: 'bash', toolOutcome: 'ok' });
    const second = familySample(bundle, 'The answer is 5.', 'stop', 4);
    expect(parser.parse(ledger.appendSampled(second))).toEqual({ calls: [], errors: [] });
    const snapshot = ledger.finish();
    const [a1, env, a2] = snapshot.turns;
    expect(snapshot.responseIds.slice(a1!.start, a1!.end)).toEqual(first.tokenIds);
    expect(snapshot.responseIds.slice(a2!.start, a2!.end)).toEqual(second.tokenIds);
    expect(snapshot.logprobs.slice(env!.start, env!.end).every((p) => p === 0)).toBe(true);
    const observation = tokenizer.decode(snapshot.responseIds.slice(env!.start, env!.end));
    expect(observation).toContain('5');
    if (!EXPECTED[family].toolRole) expect(observation).toContain('Output of tool "bash":\n5');
    expect(ledger.deltaMethods.isolated).toBe(0);
  });

  it('encodes through the segment cache exactly as the library does, and plain text never to a structural added token', async () => {
    const { tokenizer } = await loadFamily(family);
    const structural = tokenizer.addedTokens.filter((t) => !tokenizer.textTokens.has(t));
    const ids = new Set(structural.map((t) => tokenizer.tokenId(t)!));
    const piece = fc.oneof(fc.constantFrom(...structural.slice(0, 40)), fc.string({ unit: 'grapheme', maxLength: 30 }), fc.constantFrom('\n', '\n\n', '  ', 'system\nYou are helpful.'.repeat(4)));
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 10 }), (pieces) => {
        const text = pieces.join('');
        expect(tokenizer.encode(text)).toEqual(tokenizer.encodeUncached(text));
        expect(tokenizer.encode(text)).toEqual(tokenizer.encodeUncached(text));
        expect(tokenizer.encodeText(text).filter((id) => ids.has(id))).toEqual([]);
      }),
      { numRuns: 100 },
    );
  });
});

describe('a model folder', () => {
  it("takes chat_template.jinja over the config's chat_template, and config-chosen parser and variables", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'model-dir-'));
    try {
      for (const f of ['tokenizer.json', 'tokenizer_config.json']) await copyFile(join(familyDir('llama3_1'), f), join(dir, f));
      await writeFile(join(dir, 'chat_template.jinja'), '{% for m in messages %}[{{ m.role }}{{ flavour }}]{{ m.content }}{% endfor %}');
      const bundle = await loadModelBundle({ dir, toolCallParser: 'deepseek_v3', templateVariables: { flavour: '!' } });
      expect(bundle.template.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: false })).toBe('[user!]hi');
      expect(bundle).toMatchObject({ parserSource: 'config', parser: { name: 'deepseek_v3' } });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('fails loudly when the folder has no tokenizer', async () => {
    await expect(loadModelBundle({ dir: '/nonexistent-model-dir' })).rejects.toMatchObject({ code: 'not_found' });
  });
});
