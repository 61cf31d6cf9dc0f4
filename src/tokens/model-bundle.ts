import type { ModelConfig, ToolCallParserName } from '../config.js';
import { createToolCallParser, detectToolCallParser } from '../tools/parsers.js';
import type { ToolCallParser } from '../tools/types.js';
import { AdaptedChatTemplate } from './adapted-template.js';
import { toolInstructions } from './tool-instructions.js';
import { probeTemplate, type TemplateProfile } from './template-profile.js';
import { loadTokenizerBundle, qwen3ModelDir, type HfTokenizer } from './tokenizer.js';

/** Everything the server needs of the policy model: how to tokenize, render and read tool calls. */
export interface ModelBundle {
  dir: string;
  tokenizer: HfTokenizer;
  /** The model's template, shaped to what it accepts (see AdaptedChatTemplate). */
  template: AdaptedChatTemplate;
  parser: ToolCallParser;
  /** What the template accepts, probed once. */
  profile: TemplateProfile;
  /** Whether the parser was named by config or detected (see detectToolCallParser). */
  parserSource: 'config' | 'detected';
}

/** Which model folder to load and how (the `model` section of the config, less the engines' name for it). */
export type ModelBundleOptions = Partial<Pick<ModelConfig, 'dir' | 'templateVariables' | 'toolCallParser'>>;

/**
 * Loads a Hugging Face model folder (`model.dir`; the bundled Qwen3 when unset) with its template variables and
 * tool-call parser (`model.toolCallParser`, else detected from the template and vocabulary), probes the template
 * once (tool role, tool schemas, alternation) and wraps it accordingly. Fails at start-up (not_found,
 * failed_precondition) on a folder without the files or a template that does not parse.
 *
 * @example
 * const { tokenizer, template, parser } = await loadModelBundle({ dir: '/models/Llama-3.1-8B-Instruct' });
 */
export async function loadModelBundle(model: ModelBundleOptions = {}): Promise<ModelBundle> {
  const dir = model.dir ?? qwen3ModelDir();
  const variables = model.templateVariables ?? {};
  const { tokenizer, template: raw } = await loadTokenizerBundle(dir, Object.keys(variables).length > 0 ? variables : undefined);
  const name: ToolCallParserName = model.toolCallParser ?? detectToolCallParser(raw.source, tokenizer.addedTokens);
  const parser = createToolCallParser(name);
  const profile = probeTemplate(raw);
  const template = new AdaptedChatTemplate(raw, profile, (tools) => toolInstructions(tools, parser, profile));
  return { dir, tokenizer, template, parser, profile, parserSource: model.toolCallParser === undefined ? 'detected' : 'config' };
}
