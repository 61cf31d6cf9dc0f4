import type { ToolCallParser } from '../tools/types.js';
import type { TemplateProfile } from './template-profile.js';
import type { ToolSchema } from './types.js';

/**
 * The system-prompt text that describes the tools for a template that does not (Llama-3.1's short template,
 * DeepSeek-V3's, Gemma 3's): the schemas as JSON, one per line, and the call format written by the parser
 * itself, so what the model is told is what the server parses. For a template without a tool role it also says
 * how results come back (see AdaptedChatTemplate). Template text, not environment text: for DeepSeek-V3 the
 * example's <｜tool▁calls▁begin｜> and friends are the real tokens the model must sample.
 */
export function toolInstructions(tools: readonly ToolSchema[], parser: ToolCallParser, profile: TemplateProfile): string {
  const example = parser.format([{ name: '<tool name>', arguments: { '<argument>': '<value>' } }]);
  const lines = [
    '# Tools',
    '',
    'You may call one or more of these tools (JSON Schema of each):',
    ...tools.map((t) => JSON.stringify(t)),
    '',
    'To call a tool, reply with the call in exactly this form:',
    example,
  ];
  if (!profile.toolRole) lines.push('', 'Each result comes back in a user message that starts with "Output of tool".');
  return lines.join('\n');
}
