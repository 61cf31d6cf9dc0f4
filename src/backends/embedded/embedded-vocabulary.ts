import { RolloutError } from '../../errors.js';
import type { HfTokenizer } from '../../tokens/tokenizer.js';
import { embeddedModelFileProblem, parseEmbeddedUrl, type EmbeddedModelSpec } from './embedded-url.js';
import { ensureTinyQwen3Gguf } from './tiny-qwen3.js';

/** What the check needs of the server's tokenizer: its ids [0, vocabSize) and the id of a token string. */
export type VocabularyOf = Pick<HfTokenizer, 'vocabSize' | 'tokenId' | 'tokenAt'>;

/**
 * Why the GGUF an embedded backend names cannot serve this server's tokenizer, or undefined when it can: every id
 * the tokenizer has must be the same token in the model (the GGUF's `tokenizer.ggml.tokens`). Token-in/token-out
 * means the engine is handed the tokenizer's ids as they are; a model whose ids mean other tokens (another model
 * family, another revision's added tokens) would run and return garbage with plausible logprobs, so the start-up
 * refuses it. Ids past the tokenizer's (padding rows of the embedding) and ids it has no token for are not compared. Reads the GGUF's header
 * only, not its weights.
 */
export async function embeddedVocabularyProblem(spec: EmbeddedModelSpec, tokenizer: VocabularyOf): Promise<string | undefined> {
  const path = spec.model.kind === 'file' ? spec.model.path : await ensureTinyQwen3Gguf();
  let tokens: readonly string[] | undefined;
  try {
    // Imported here: node-llama-cpp is loaded only by servers that run an embedded engine.
    const { readGgufFileInfo } = await import('node-llama-cpp');
    const info = await readGgufFileInfo(path, { readTensorInfo: false, sourceType: 'filesystem', logWarnings: false });
    tokens = info.metadata.tokenizer?.ggml?.tokens;
  } catch (err) {
    return `${path} is not a readable GGUF file: ${err instanceof Error ? err.message : String(err)}`;
  }
  if (tokens === undefined) return `${path} has no vocabulary (tokenizer.ggml.tokens)`;
  const size = tokenizer.vocabSize;
  if (tokens.length < size) return `${path} has another vocabulary than the tokenizer: ${tokens.length} ids, the tokenizer has ${size}`;
  let differing = 0;
  let first: { id: number; token: string; there: number | undefined } | undefined;
  for (let id = 0; id < size; id++) {
    const token = tokens[id]!;
    const there = tokenizer.tokenId(token);
    // An id the tokenizer has no token for (a hole in its vocabulary: the GGUF holds a placeholder there) is never sent.
    if (there === id || (there === undefined && tokenizer.tokenAt(id) === undefined)) continue;
    differing++;
    first ??= { id, token, there };
  }
  if (first === undefined) return undefined;
  const where = first.there === undefined ? 'not in the tokenizer' : `id ${first.there} in the tokenizer`;
  return `${path} has another vocabulary than the tokenizer: ${differing} of its first ${size} ids differ, the first ${first.id} (${JSON.stringify(first.token)} in the model, ${where})`;
}

/**
 * Refuses the first embedded backend of a server's config whose GGUF does not have the server's vocabulary
 * (invalid_argument naming `backends[i].url`): checked at start, before any trajectory is sampled from it.
 */
export async function checkEmbeddedVocabularies(backends: ReadonlyArray<{ kind: string; url: string }>, tokenizer: VocabularyOf): Promise<void> {
  for (const [i, b] of backends.entries()) {
    if (b.kind !== 'embedded') continue;
    const problem = await embeddedVocabularyProblem(parseEmbeddedUrl(b.url), tokenizer);
    if (problem !== undefined) throw new RolloutError('invalid_argument', `backends[${i}].url: the embedded engine's model ${problem}`, { field: `backends.${i}.url` });
  }
}

/**
 * Why an embedded engine at `url` (a URL its kind accepts) cannot serve this server: its GGUF is not there, or has
 * another vocabulary; undefined when it can. What AddBackend checks, as `serve` does for configured ones at start.
 */
export async function embeddedBackendProblem(url: string, tokenizer: VocabularyOf): Promise<string | undefined> {
  const spec = parseEmbeddedUrl(url);
  return embeddedModelFileProblem(spec) ?? (await embeddedVocabularyProblem(spec, tokenizer));
}
