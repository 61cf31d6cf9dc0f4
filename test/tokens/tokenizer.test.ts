import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutError } from '../../src/errors.js';
import { loadQwen3, loadTokenizer, loadTokenizerBundle, qwen3ModelDir, type HfTokenizer } from '../../src/tokens/tokenizer.js';

let tokenizer: HfTokenizer;
beforeAll(async () => {
  ({ tokenizer } = await loadQwen3());
});

describe('Qwen3 tokenizer', () => {
  it('is loaded once per directory', async () => {
    expect(await loadTokenizer(qwen3ModelDir())).toBe(tokenizer);
    expect(await loadTokenizer(`${qwen3ModelDir()}/../models`)).toBe(tokenizer);
  });

  it('does not add BOS or EOS', () => {
    expect(tokenizer.encode('hello')).toEqual([tokenizer.tokenId('hello')]);
    expect(tokenizer.encode('')).toEqual([]);
  });

  it('parses special and added tokens written in the text', () => {
    const ids = tokenizer.encode('<|im_start|>user\nhi<|im_end|>\n<think>\nx\n</think>');
    expect(ids[0]).toBe(tokenizer.tokenId('<|im_start|>'));
    expect(ids).toContain(tokenizer.tokenId('<|im_end|>'));
    expect(ids).toContain(tokenizer.tokenId('<think>'));
    expect(ids).toContain(tokenizer.tokenId('</think>'));
  });

  it('round-trips text with special tokens, whitespace and non-ASCII', () => {
    for (const text of [
      '<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>assistant\n',
      '  leading and trailing spaces  \n\n\t',
      'naïve café 中文 🙂 <tool_call>\n{"a": 1}\n</tool_call>',
      '<|endoftext|><|im_end|>',
    ]) {
      expect(tokenizer.decode(tokenizer.encode(text))).toBe(text);
    }
  });

  it('round-trips any Unicode text up to NFC normalization', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 60 }), (text) => {
        expect(tokenizer.decode(tokenizer.encode(text))).toBe(text.normalize('NFC'));
      }),
      { numRuns: 200 },
    );
  });

  it('drops special tokens from decoded text only when asked', () => {
    const ids = tokenizer.encode('<|im_start|>assistant\nok<|im_end|>');
    expect(tokenizer.decode(ids, { skipSpecialTokens: true })).toBe('assistant\nok');
    expect(tokenizer.decode(ids)).toBe('<|im_start|>assistant\nok<|im_end|>');
  });

  it('stops on <|im_end|> (the eos_token) and <|endoftext|>', () => {
    expect(tokenizer.stopTokenIds).toEqual([tokenizer.tokenId('<|im_end|>'), tokenizer.tokenId('<|endoftext|>')]);
  });

  it('answers undefined for a token that is not in the vocabulary', () => {
    expect(tokenizer.tokenId('<|no such token|>')).toBeUndefined();
  });
});

describe('loading a model directory', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'tokens-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('fails with not_found when tokenizer.json is missing', async () => {
    const error = await loadTokenizer(join(dir, 'missing')).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RolloutError);
    expect((error as RolloutError).code).toBe('not_found');
  });

  it('fails with failed_precondition when a file is not JSON, and retries afterwards', async () => {
    const broken = join(dir, 'broken');
    await mkdir(broken, { recursive: true });
    await writeFile(join(broken, 'tokenizer.json'), '{ not json');
    await writeFile(join(broken, 'tokenizer_config.json'), '{}');
    await expect(loadTokenizer(broken)).rejects.toMatchObject({ code: 'failed_precondition' });
    await expect(loadTokenizer(broken)).rejects.toMatchObject({ code: 'failed_precondition' });
  });

  it('reads chat_template.jinja when tokenizer_config.json has no template', async () => {
    const model = join(dir, 'jinja-file');
    await mkdir(model, { recursive: true });
    await symlink(join(qwen3ModelDir(), 'tokenizer.json'), join(model, 'tokenizer.json'));
    await writeFile(join(model, 'tokenizer_config.json'), JSON.stringify({ eos_token: { content: '<|im_end|>' } }));
    await writeFile(join(model, 'chat_template.jinja'), '{% for m in messages %}[{{ m.content }}]{{ eos_token }}{% endfor %}');
    const bundle = await loadTokenizerBundle(model);
    expect(bundle.template.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: false })).toBe('[hi]<|im_end|>');
    expect(bundle.tokenizer.stopTokenIds[0]).toBe(tokenizer.tokenId('<|im_end|>'));
  });

  it('refuses a directory without any chat template when a template is asked for', async () => {
    const model = join(dir, 'no-template');
    await mkdir(model, { recursive: true });
    await symlink(join(qwen3ModelDir(), 'tokenizer.json'), join(model, 'tokenizer.json'));
    await writeFile(join(model, 'tokenizer_config.json'), '{}');
    await expect(loadTokenizerBundle(model)).rejects.toMatchObject({ code: 'failed_precondition' });
  });
});

describe('HfTokenizer.vocabSize', () => {
  it('is one past the largest id, added tokens included, and agrees with decoding', async () => {
    const { loadQwen3 } = await import('../../src/tokens/tokenizer.js');
    const { vocabSize } = await import('../../src/tokens/vocab.js');
    const { tokenizer } = await loadQwen3();
    expect(tokenizer.vocabSize).toBe(151_669);
    expect(tokenizer.tokenId('<|im_end|>')).toBeLessThan(tokenizer.vocabSize);
    expect(tokenizer.decode([tokenizer.vocabSize - 1])).not.toBe('');
    expect(vocabSize(tokenizer)).toBe(tokenizer.vocabSize);
  });
});
