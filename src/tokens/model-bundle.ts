import type { ModelConfig, ToolCallParserName } from '../config.js';
import { createToolCallParser, detectToolCallParser } from '../tools/parsers.js';
import type { ToolCallParser } from '../tools/types.js';
import { AdaptedChatTemplate } from './adapted-template.js';
import { ToolUseChatTemplate } from './chat-template.js';
import type { ModelFileContents } from './model-files.js';
import { toolInstructions } from './tool-instructions.js';
import { probeTemplate, type TemplateProfile } from './template-profile.js';
import { loadTokenizerBundle, qwen3ModelDir, tokenizerBundleFromContents, type HfTokenizer, type TokenizerBundle } from './tokenizer.js';
import type { ChatTemplate } from './types.js';

/** Everything the server needs of the policy model: how to tokenize, render and read tool calls. */
export interface ModelBundle {
  dir: string;
  tokenizer: HfTokenizer;
  /**
   * The model's template, shaped to what it accepts (an AdaptedChatTemplate); for a model with a "tool_use" named
   * template, that one (shaped to its own profile) for conversations with tools (a ToolUseChatTemplate).
   */
  template: AdaptedChatTemplate | ToolUseChatTemplate;
  parser: ToolCallParser;
  /** What the template accepts, probed once (the "default" template's when there are named ones). */
  profile: TemplateProfile;
  /** What the "tool_use" template accepts, when the model has one (probed with tools: it only gets conversations with some). */
  toolUseProfile?: TemplateProfile;
  /** Whether the parser was named by config or detected (see detectToolCallParser). */
  parserSource: 'config' | 'detected';
}

/** Which model folder to load and how (the `model` section of the config, less the engines' name for it). */
export type ModelBundleOptions = Partial<Pick<ModelConfig, 'dir' | 'templateVariables' | 'toolCallParser'>>;

/**
 * Loads a Hugging Face model folder (`model.dir`; the bundled Qwen3 when unset) with its template variables and
 * tool-call parser (`model.toolCallParser`, else detected from the template and vocabulary), probes the template
 * once (tool role, tool schemas, alternation) and wraps it accordingly. Fails at start-up (not_found,
 * failed_precondition) on a folder without the files or a template that does not parse or does not write the
 * messages it is given.
 *
 * @example
 * const { tokenizer, template, parser } = await loadModelBundle({ dir: '/models/Llama-3.1-8B-Instruct' });
 */
export async function loadModelBundle(model: ModelBundleOptions = {}): Promise<ModelBundle> {
  const dir = model.dir ?? qwen3ModelDir();
  return assemble(dir, await loadTokenizerBundle(dir, variablesOf(model)), model);
}

/**
 * {@link loadModelBundle} from a model folder's files as the server read them (loadedModelContents), touching no
 * disk: a token thread's bundle, which must be the server's whatever the folder holds by the time the thread starts.
 */
export function modelBundleFromContents(contents: ModelFileContents, model: Omit<ModelBundleOptions, 'dir'> = {}): ModelBundle {
  return assemble(contents.dir, tokenizerBundleFromContents(contents, variablesOf(model)), model);
}

function variablesOf(model: ModelBundleOptions): Record<string, unknown> | undefined {
  const variables = model.templateVariables ?? {};
  return Object.keys(variables).length > 0 ? variables : undefined;
}

function assemble(dir: string, { tokenizer, template: raw, toolUseTemplate }: TokenizerBundle, model: ModelBundleOptions): ModelBundle {
  // The call format may be written by the "tool_use" template only (Hermes-2-Pro's "default" is plain ChatML).
  const sources = toolUseTemplate === undefined ? raw.source : `${raw.source}\n${toolUseTemplate.source}`;
  const name: ToolCallParserName = model.toolCallParser ?? detectToolCallParser(sources, tokenizer.addedTokens);
  const parser = createToolCallParser(name);
  const adapt = (inner: ChatTemplate, profile: TemplateProfile): AdaptedChatTemplate => new AdaptedChatTemplate(inner, profile, (tools) => toolInstructions(tools, parser, profile));
  const profile = probeTemplate(raw);
  const base = adapt(raw, profile);
  const parserSource = model.toolCallParser === undefined ? 'detected' : 'config';
  if (toolUseTemplate === undefined) return { dir, tokenizer, template: base, parser, profile, parserSource };
  const toolUseProfile = probeTemplate(toolUseTemplate, true);
  const template = new ToolUseChatTemplate(base, adapt(toolUseTemplate, toolUseProfile));
  return { dir, tokenizer, template, parser, profile, toolUseProfile, parserSource };
}
