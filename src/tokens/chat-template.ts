import { Template } from '@huggingface/jinja';
import { RolloutError } from '../errors.js';
import { specialTokenString, type TokenizerConfig } from './model-files.js';
import type { ChatMessage, ChatTemplate, ToolSchema } from './types.js';

/** Options of {@link JinjaChatTemplate}. */
export interface JinjaChatTemplateOptions {
  /** bos_token, eos_token, pad_token, unk_token as the template sees them (missing ones render as ""). */
  specialTokens?: Partial<Record<'bos_token' | 'eos_token' | 'pad_token' | 'unk_token', string>>;
  /**
   * Extra template variables, e.g. `{ enable_thinking: false }` for Qwen3. They cannot override `messages`,
   * `tools` or `add_generation_prompt`.
   */
  variables?: Record<string, unknown>;
}

/**
 * A chat template executed with @huggingface/jinja, the JavaScript port of the Jinja subset that transformers'
 * `apply_chat_template` uses. We render the model's own template instead of hand-writing its format, so a new
 * model needs no code, only its tokenizer_config.json.
 *
 * Variables follow transformers: `messages` (plain {role, content, name?} objects), `tools` (the OpenAI function
 * schemas, or `none` when there are none: templates test `if tools` / `tools is not none`),
 * `add_generation_prompt`, and the special-token strings. `raise_exception` from the template becomes an
 * `invalid_argument` RolloutError, since it means the conversation has a shape the model does not accept.
 *
 * Rendering is pure: the same arguments always give the same string (the ledger relies on this to diff renders).
 *
 * @example
 * const template = JinjaChatTemplate.fromConfig(config, { variables: { enable_thinking: false } });
 * template.render([{ role: 'user', content: 'hi' }], { addGenerationPrompt: true });
 */
export class JinjaChatTemplate implements ChatTemplate {
  private readonly template: Template;
  private readonly fixed: Record<string, unknown>;

  /** @param source the Jinja source, e.g. tokenizer_config.json's `chat_template`. */
  constructor(
    readonly source: string,
    options: JinjaChatTemplateOptions = {},
  ) {
    try {
      this.template = new Template(source);
    } catch (err) {
      throw new RolloutError('failed_precondition', `chat template does not parse: ${describe(err)}`, { cause: err });
    }
    const tokens = options.specialTokens ?? {};
    this.fixed = {
      bos_token: tokens.bos_token ?? '',
      eos_token: tokens.eos_token ?? '',
      pad_token: tokens.pad_token ?? '',
      unk_token: tokens.unk_token ?? '',
      ...options.variables,
    };
  }

  /** The template of a tokenizer_config.json with its special tokens; `failed_precondition` when it has none. */
  static fromConfig(
    config: TokenizerConfig,
    source: string | undefined,
    variables?: Record<string, unknown>,
  ): JinjaChatTemplate {
    if (source === undefined) throw new RolloutError('failed_precondition', 'the tokenizer has no chat_template');
    const specialTokens: NonNullable<JinjaChatTemplateOptions['specialTokens']> = {};
    for (const key of ['bos_token', 'eos_token', 'pad_token', 'unk_token'] as const) {
      const value = specialTokenString(config[key]);
      if (value !== undefined) specialTokens[key] = value;
    }
    return new JinjaChatTemplate(source, variables === undefined ? { specialTokens } : { specialTokens, variables });
  }

  render(
    messages: readonly ChatMessage[],
    options: { addGenerationPrompt: boolean; tools?: readonly ToolSchema[] },
  ): string {
    const tools = options.tools !== undefined && options.tools.length > 0 ? plainTools(options.tools) : null;
    try {
      return this.template.render({
        ...this.fixed,
        messages: messages.map(plainMessage),
        tools,
        add_generation_prompt: options.addGenerationPrompt,
      });
    } catch (err) {
      throw new RolloutError('invalid_argument', `chat template failed: ${describe(err)}`, {
        cause: err,
        field: 'messages',
      });
    }
  }
}

/** Copies a message, leaving out absent fields so `message.name is defined` behaves as in Python. */
function plainMessage(message: ChatMessage): Record<string, unknown> {
  const plain: Record<string, unknown> = { role: message.role, content: message.content };
  if (message.name !== undefined) plain['name'] = message.name;
  return plain;
}

/**
 * Deep copy through JSON: the template sees plain data, and tojson prints exactly what the caller gave. Cached
 * per tools array (an environment passes the same one every turn), since this ran on every render.
 */
function plainTools(tools: readonly ToolSchema[]): unknown[] {
  let plain = plainToolsCache.get(tools);
  if (!plain) plainToolsCache.set(tools, (plain = JSON.parse(JSON.stringify(tools)) as unknown[]));
  return plain;
}

const plainToolsCache = new WeakMap<readonly ToolSchema[], unknown[]>();

function describe(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/**
 * A model's named templates as transformers picks them (PreTrainedTokenizerBase.get_chat_template, and so vLLM's
 * chat endpoint): `toolUse` ("tool_use") for a render given tools, `base` ("default") otherwise. Chosen per render
 * by its tools, which a trajectory passes the same to every render (TokenLedger's `tools`), so all of a trajectory's
 * renders come from one template; every cache of renders and probes is keyed by the tools too (tools-key.ts).
 * An empty tool list counts as none, as everywhere in this project (the template sees `tools` = none); transformers
 * would take "tool_use" for `tools=[]`.
 */
export class ToolUseChatTemplate implements ChatTemplate {
  constructor(
    readonly base: ChatTemplate,
    readonly toolUse: ChatTemplate,
  ) {}

  render(messages: readonly ChatMessage[], options: { addGenerationPrompt: boolean; tools?: readonly ToolSchema[] }): string {
    return (options.tools !== undefined && options.tools.length > 0 ? this.toolUse : this.base).render(messages, options);
  }
}
