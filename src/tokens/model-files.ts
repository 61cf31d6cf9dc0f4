import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { RolloutError } from '../errors.js';

/**
 * The parts of a Hugging Face tokenizer_config.json this project reads. Special tokens appear either as plain
 * strings or, in older files, as serialized AddedToken objects (`{ content: "<|im_end|>", ... }`).
 */
export interface TokenizerConfig {
  chat_template?: string | readonly { name: string; template: string }[] | null;
  bos_token?: SpecialTokenValue;
  eos_token?: SpecialTokenValue;
  pad_token?: SpecialTokenValue;
  unk_token?: SpecialTokenValue;
  [key: string]: unknown;
}

/** A special token as tokenizer_config.json spells it. */
export type SpecialTokenValue = string | { content: string } | null | undefined;

const TOOL_USE_FILE = 'additional_chat_templates/tool_use.jinja';

/**
 * The files of a model directory this project reads. additional_chat_templates/<name>.jinja holds the named templates
 * besides chat_template.jinja (the "default") as transformers saves them now; only "tool_use" is ever rendered.
 */
export const MODEL_FILE_NAMES = ['tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja', TOOL_USE_FILE, 'generation_config.json', 'config.json'] as const;
export type ModelFileName = (typeof MODEL_FILE_NAMES)[number];

/**
 * A model directory's files exactly as read, unparsed: what everything the server tokenizes with is built from.
 * Token threads get these (structured clone) instead of reading the directory again, which could by then hold other
 * files (a checkpoint saved into it, a newer template revision) or none (a purged scratch directory). Bytes, not
 * strings: Qwen3's tokenizer.json is 11 MB of UTF-8 but would be 22 MB as a (two-byte) string on the heap, kept for
 * as long as the server runs.
 */
export interface ModelFileContents {
  dir: string;
  /** Each file present, by name; the two required ones are always there. */
  bytes: Partial<Record<ModelFileName, Uint8Array>>;
}

/** A chat template's Jinja source and where it comes from (what an error about it names). */
export interface TemplateSource {
  source: string;
  /** The file, and the entry within it: `/m/chat_template.jinja`, `/m/tokenizer_config.json chat_template "default"`. */
  origin: string;
}

/** The files of one model directory, parsed. */
export interface ModelFiles {
  dir: string;
  tokenizerJson: Record<string, unknown>;
  config: TokenizerConfig;
  /**
   * The chat template: the folder's `chat_template.jinja` when there is one (template files override the config's
   * templates, as in transformers, which saves templates there since v4.47), else `chat_template` of
   * tokenizer_config.json (its "default" when that is a list of named templates).
   */
  chatTemplate: TemplateSource | undefined;
  /**
   * The named template "tool_use", when there is one: additional_chat_templates/tool_use.jinja, or without template
   * files the "tool_use" entry of tokenizer_config.json's named templates. transformers
   * (PreTrainedTokenizerBase.get_chat_template), and so vLLM's chat endpoint, render a conversation with tools
   * through it.
   */
  toolUseTemplate: TemplateSource | undefined;
  /** generation_config.json's `eos_token_id` (a number or a list): the ids generation stops at. Empty without it. */
  eosTokenIds: number[];
  /**
   * config.json's `vocab_size` (`text_config.vocab_size` for a multimodal model such as Gemma 3): how many rows the
   * model's output layer has. Often more than the tokenizer's ids (Qwen3: 151,936 against 151,669; Gemma 3: 262,208
   * against 262,145), padded for the GPU; the engine can sample any of them. Undefined without config.json or the field.
   */
  modelVocabSize: number | undefined;
  /** The files as read, which all of the above comes from. */
  contents: ModelFileContents;
}

/** The string of a special token value, undefined when absent. */
export function specialTokenString(value: SpecialTokenValue): string | undefined {
  if (typeof value === 'string') return value;
  if (value !== null && typeof value === 'object' && typeof value.content === 'string') return value.content;
  return undefined;
}

/**
 * Reads tokenizer.json and tokenizer_config.json, and the optional chat_template.jinja, generation_config.json and config.json,
 * from `dir`, and parses them (see {@link parseModelFiles}). A missing required file is `not_found`; a file that is
 * not JSON is `failed_precondition`: both are deployment mistakes that must fail loudly at start-up rather than
 * produce wrong token ids later.
 */
export async function readModelFiles(dir: string): Promise<ModelFiles> {
  return parseModelFiles(await readModelFileContents(dir));
}

/**
 * Refuses a model folder that is not there: invalid_argument naming `field` (the config's `model.dir`, which
 * `--model-dir` sets) when `dir` does not exist or is not a directory — a mistake in what was asked, which an operator
 * fixes in the command (exit 2), unlike a folder that is there but lacks a file (see {@link readModelFileContents}).
 */
export async function checkModelDir(dir: string, field = 'model.dir'): Promise<void> {
  let isDirectory: boolean;
  try {
    isDirectory = (await stat(dir)).isDirectory();
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new RolloutError('invalid_argument', `${field}: ${dir} ${code === 'ENOENT' ? 'does not exist' : `cannot be read (${code ?? String(err)})`}: a Hugging Face model folder is needed (tokenizer.json, tokenizer_config.json)`, { field, cause: err });
  }
  if (!isDirectory) throw new RolloutError('invalid_argument', `${field}: ${dir} is not a directory: a Hugging Face model folder is needed (tokenizer.json, tokenizer_config.json)`, { field });
}

/** The files of `dir` as they are now, unparsed; `not_found` when a required one is missing. */
export async function readModelFileContents(dir: string): Promise<ModelFileContents> {
  const bytes: ModelFileContents['bytes'] = {};
  for (const name of MODEL_FILE_NAMES) {
    const path = join(dir, name);
    const content = await readOptional(path);
    if (content !== undefined) bytes[name] = content;
    else if (name === 'tokenizer.json' || name === 'tokenizer_config.json') throw new RolloutError('not_found', `tokenizer file not found: ${path}`);
  }
  return { dir, bytes };
}

/**
 * Parses files read by {@link readModelFileContents}, touching no disk: a token thread builds the server's tokenizer
 * and template from the contents the server read. `failed_precondition` for a file that is not what it must be: JSON
 * that is not an object, an empty template file, named templates that are malformed or have no "default".
 */
export function parseModelFiles(contents: ModelFileContents): ModelFiles {
  const { dir, bytes } = contents;
  const tokenizerJson = parseJson(contents, 'tokenizer.json');
  const config = parseJson(contents, 'tokenizer_config.json') as TokenizerConfig;
  const fileTemplate = (name: 'chat_template.jinja' | typeof TOOL_USE_FILE): TemplateSource | undefined => {
    const content = bytes[name];
    if (content === undefined) return undefined;
    const origin = join(dir, name);
    const source = text(content);
    // transformers takes the file as the template whatever it holds, so falling back to the config's would render
    // unlike the engine; an empty template renders every conversation as "": refused rather than guessed at.
    if (source.trim() === '') throw new RolloutError('failed_precondition', `${origin} is empty: template files override tokenizer_config.json's chat_template, and this one renders no conversation`);
    return { source, origin };
  };
  const jinja = fileTemplate('chat_template.jinja');
  const toolUseFile = fileTemplate(TOOL_USE_FILE);
  if (toolUseFile !== undefined && jinja === undefined) {
    throw new RolloutError('failed_precondition', `${toolUseFile.origin} without ${join(dir, 'chat_template.jinja')}: no "default" template, which transformers and vLLM need for a conversation without tools`);
  }
  const templates = jinja !== undefined ? { chatTemplate: jinja, toolUseTemplate: toolUseFile } : configTemplates(config.chat_template, join(dir, 'tokenizer_config.json'));
  const generation = bytes['generation_config.json'] === undefined ? {} : parseJson(contents, 'generation_config.json');
  const eos = generation['eos_token_id'];
  const eosTokenIds = (Array.isArray(eos) ? eos : [eos]).filter((id): id is number => Number.isInteger(id));
  const modelVocabSize = bytes['config.json'] === undefined ? undefined : vocabSizeOf(parseJson(contents, 'config.json'), join(dir, 'config.json'));
  return { dir, tokenizerJson, config, ...templates, eosTokenIds, modelVocabSize, contents };
}

/** The most ids a model may declare (2^24: sixty times the largest vocabulary of a released model, Gemma 3's 262K). */
export const MAX_VOCAB_IDS = 2 ** 24;

/**
 * config.json's `vocab_size`, or its `text_config`'s (transformers' composite configs: the language model's);
 * undefined when neither has one. One that is there but is not an integer in [1, MAX_VOCAB_IDS] is refused
 * (failed_precondition): the bound every sampled id is checked against must not be a guess.
 */
function vocabSizeOf(config: Record<string, unknown>, path: string): number | undefined {
  const textConfig = config['text_config'];
  const [field, value] =
    config['vocab_size'] !== undefined && config['vocab_size'] !== null
      ? ['vocab_size', config['vocab_size']]
      : typeof textConfig === 'object' && textConfig !== null
        ? ['text_config.vocab_size', (textConfig as Record<string, unknown>)['vocab_size']]
        : ['vocab_size', undefined];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1 || value > MAX_VOCAB_IDS) {
    throw new RolloutError('failed_precondition', `${path}: ${field} must be an integer in [1, ${MAX_VOCAB_IDS}], got ${String(JSON.stringify(value)).slice(0, 40)}`);
  }
  return value;
}

/**
 * tokenizer_config.json's `chat_template`: one template, or named ones (a list of {name, template}: Hermes-2-Pro,
 * Hermes-3, Command-R) of which transformers renders "tool_use" for a conversation with tools when there is one and
 * "default" otherwise, raising when there is no "default" for it. A list without "default" is refused here, at
 * start-up, rather than with the first task without tools; a malformed entry too (transformers fails to load it).
 */
function configTemplates(value: unknown, path: string): { chatTemplate: TemplateSource | undefined; toolUseTemplate: TemplateSource | undefined } {
  if (value === undefined || value === null) return { chatTemplate: undefined, toolUseTemplate: undefined };
  if (typeof value === 'string') return { chatTemplate: { source: value, origin: `${path} chat_template` }, toolUseTemplate: undefined };
  if (!Array.isArray(value)) throw new RolloutError('failed_precondition', `${path}: chat_template is neither a string nor a list of {name, template}`);
  // Later entries of one name win, as in transformers' dict of them.
  const named = new Map<string, string>();
  for (const [i, entry] of (value as unknown[]).entries()) {
    const { name, template } = (typeof entry === 'object' && entry !== null ? entry : {}) as Record<string, unknown>;
    if (typeof name !== 'string' || typeof template !== 'string') {
      throw new RolloutError('failed_precondition', `${path}: chat_template[${i}] is not a {name, template} pair of strings`);
    }
    named.set(name, template);
  }
  const pick = (name: string): TemplateSource | undefined => {
    const source = named.get(name);
    return source === undefined ? undefined : { source, origin: `${path} chat_template ${JSON.stringify(name)}` };
  };
  const chatTemplate = pick('default');
  if (chatTemplate === undefined) {
    const names = [...named.keys()].map((n) => JSON.stringify(n)).join(', ');
    throw new RolloutError('failed_precondition', `${path}: chat_template lists named templates (${names || 'none'}) but no "default", which transformers and vLLM need for a conversation without tools`);
  }
  return { chatTemplate, toolUseTemplate: pick('tool_use') };
}

function parseJson(contents: ModelFileContents, name: ModelFileName): Record<string, unknown> {
  const path = join(contents.dir, name);
  const content = contents.bytes[name];
  if (content === undefined) throw new RolloutError('not_found', `tokenizer file not found: ${path}`);
  try {
    const value: unknown = JSON.parse(text(content));
    if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new Error('not a JSON object');
    return value as Record<string, unknown>;
  } catch (err) {
    throw new RolloutError('failed_precondition', `invalid ${name === 'config.json' ? 'model' : 'tokenizer'} file ${path}`, { cause: err });
  }
}

/** A file's text, decoded as `readFile(path, 'utf8')` decodes it (a byte-order mark is kept, not dropped). */
function text(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('utf8');
}

async function readOptional(path: string): Promise<Uint8Array | undefined> {
  try {
    return await readFile(path);
  } catch (err) {
    if (err instanceof Error && (err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new RolloutError('failed_precondition', `cannot read ${path}`, { cause: err });
  }
}
