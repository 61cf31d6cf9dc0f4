import { readFile } from 'node:fs/promises';
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

/** The files of one model directory, parsed. */
export interface ModelFiles {
  dir: string;
  tokenizerJson: Record<string, unknown>;
  config: TokenizerConfig;
  /**
   * The chat template: the folder's `chat_template.jinja` when there is one (it overrides the config's, as in
   * transformers, which saves templates there since v4.47), else `chat_template` of tokenizer_config.json.
   */
  chatTemplate: string | undefined;
  /** generation_config.json's `eos_token_id` (a number or a list): the ids generation stops at. Empty without it. */
  eosTokenIds: number[];
}

/** The string of a special token value, undefined when absent. */
export function specialTokenString(value: SpecialTokenValue): string | undefined {
  if (typeof value === 'string') return value;
  if (value !== null && typeof value === 'object' && typeof value.content === 'string') return value.content;
  return undefined;
}

/**
 * Reads tokenizer.json and tokenizer_config.json, and the optional chat_template.jinja and generation_config.json,
 * from `dir`. A missing required file is `not_found`; a file that is not JSON is `failed_precondition`: both are
 * deployment mistakes that must fail loudly at start-up rather than produce wrong token ids later.
 */
export async function readModelFiles(dir: string): Promise<ModelFiles> {
  const tokenizerJson = await readJson(join(dir, 'tokenizer.json'));
  const config = (await readJson(join(dir, 'tokenizer_config.json'))) as TokenizerConfig;
  const chatTemplate = (await readOptional(join(dir, 'chat_template.jinja'))) ?? pickTemplate(config.chat_template);
  const generation = (await readOptional(join(dir, 'generation_config.json'))) === undefined ? {} : await readJson(join(dir, 'generation_config.json'));
  const eos = generation['eos_token_id'];
  const eosTokenIds = (Array.isArray(eos) ? eos : [eos]).filter((id): id is number => Number.isInteger(id));
  return { dir, tokenizerJson, config, chatTemplate, eosTokenIds };
}

/** Named templates (a list of {name, template}) use "default", as transformers does without a template name. */
function pickTemplate(value: TokenizerConfig['chat_template']): string | undefined {
  if (typeof value === 'string') return value;
  if (Array.isArray(value)) return value.find((t) => t.name === 'default')?.template ?? value[0]?.template;
  return undefined;
}

async function readJson(path: string): Promise<Record<string, unknown>> {
  const text = await readOptional(path);
  if (text === undefined) throw new RolloutError('not_found', `tokenizer file not found: ${path}`);
  try {
    const value: unknown = JSON.parse(text);
    if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new Error('not a JSON object');
    return value as Record<string, unknown>;
  } catch (err) {
    throw new RolloutError('failed_precondition', `invalid tokenizer file ${path}`, { cause: err });
  }
}

async function readOptional(path: string): Promise<string | undefined> {
  try {
    return await readFile(path, 'utf8');
  } catch (err) {
    if (err instanceof Error && (err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new RolloutError('failed_precondition', `cannot read ${path}`, { cause: err });
  }
}
