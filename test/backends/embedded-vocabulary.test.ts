import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { embeddedVocabularyProblem } from '../../src/backends/embedded/embedded-vocabulary.js';
import { parseEmbeddedUrl, TINY_QWEN3_URL } from '../../src/backends/embedded/embedded-url.js';
import { writeTinyQwen3Gguf, DEFAULT_TINY_QWEN3 } from '../../src/backends/embedded/tiny-qwen3.js';
import { loadQwen3, qwen3ModelDir, type TokenizerBundle } from '../../src/tokens/tokenizer.js';

let dir: string;
let tokenizer: TokenizerBundle['tokenizer'];
/** A GGUF like the tiny Qwen3 but with ids of "a" and "b" swapped: a user model whose vocabulary is not the tokenizer's. */
let swapped: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'embedded-vocab-'));
  ({ tokenizer } = await loadQwen3());
  const json = JSON.parse(readFileSync(join(qwen3ModelDir(), 'tokenizer.json'), 'utf8')) as NonNullable<Parameters<typeof writeTinyQwen3Gguf>[2]>['json'];
  const [a, b] = [json.model.vocab.a!, json.model.vocab.b!];
  json.model.vocab.a = b;
  json.model.vocab.b = a;
  swapped = join(dir, 'swapped.gguf');
  writeTinyQwen3Gguf(swapped, DEFAULT_TINY_QWEN3, { json, chatTemplate: undefined, hash: 'swapped' });
}, 120_000);

afterAll(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe("an embedded engine's GGUF against the server's tokenizer", () => {
  it('the tiny Qwen3 (the real Qwen3 vocabulary) agrees with the Qwen3 tokenizer', async () => {
    expect(await embeddedVocabularyProblem(parseEmbeddedUrl(TINY_QWEN3_URL), tokenizer)).toBeUndefined();
  });

  it('a GGUF whose ids mean other tokens is named with the first id that differs and how many do', async () => {
    const problem = await embeddedVocabularyProblem(parseEmbeddedUrl(`file://${swapped}`), tokenizer);
    expect(problem).toBe(`${swapped} has another vocabulary than the tokenizer: 2 of its first ${tokenizer.vocabSize} ids differ, the first ${tokenizer.tokenId('a')} ("b" in the model, id ${tokenizer.tokenId('b')} in the tokenizer)`);
  });

  it('an id the tokenizer has no token for (a hole in its vocabulary) is not compared; one it has another token for is', async () => {
    const hole = tokenizer.tokenId('a')!;
    const withHole = { vocabSize: tokenizer.vocabSize, tokenId: (t: string) => (t === 'a' ? undefined : tokenizer.tokenId(t)), tokenAt: (id: number) => (id === hole ? undefined : tokenizer.tokenAt(id)) };
    expect(await embeddedVocabularyProblem(parseEmbeddedUrl(TINY_QWEN3_URL), withHole)).toBeUndefined();
    const renamed = { ...withHole, tokenAt: (id: number) => (id === hole ? 'not-a' : tokenizer.tokenAt(id)) };
    expect(await embeddedVocabularyProblem(parseEmbeddedUrl(TINY_QWEN3_URL), renamed)).toMatch(/1 of its first \d+ ids differ, the first \d+ \("a" in the model, not in the tokenizer\)/);
  });

  it('a file that is not a GGUF is named, not thrown', async () => {
    const junk = join(dir, 'junk.gguf');
    writeFileSync(junk, 'not a gguf');
    expect(await embeddedVocabularyProblem(parseEmbeddedUrl(`file://${junk}`), tokenizer)).toMatch(new RegExp(`^${junk} is not a readable GGUF file: `));
  });
});
