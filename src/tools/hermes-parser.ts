import { afterReasoning, isPlainObject, parseArguments, parseModelJson, parseTaggedCalls, pythonJson, taggedCallAround, describeJson as describe } from './call-json.js';
import type { ParsedToolCalls, ToolCall, ToolCallParser } from './types.js';

const OPEN = '<tool_call>';
const CLOSE = '</tool_call>';
const EXPECTED = `write ${OPEN}{"name": "<tool name>", "arguments": {...}}${CLOSE}`;

/**
 * Parses the Hermes/Qwen tool-call form, as Qwen2.5/Qwen3 chat templates teach it:
 *
 *     <tool_call>
 *     {"name": "python", "arguments": {"code": "print(1)"}}
 *     </tool_call>
 *
 * Several calls per message are allowed. `arguments` may also be a JSON string holding the object (some models
 * emit OpenAI-style encoded arguments) or be called `parameters`; missing arguments mean `{}`. Every problem
 * (unterminated tag, bad JSON, missing name, non-object arguments) becomes one entry in `errors`, numbered by
 * the call's position and phrased so the model can fix its next call. Never throws.
 * Text outside the tags, and a stray `</tool_call>` with no opening tag, are ignored.
 */
export class HermesToolCallParser implements ToolCallParser {
  readonly name = 'hermes';

  parse(message: string): ParsedToolCalls {
    return parseTaggedCalls(afterReasoning(message, (t, at) => taggedCallAround(t, at, OPEN)), OPEN, CLOSE, EXPECTED, parseCallBody);
  }

  format(calls: readonly ToolCall[]): string {
    return calls.map((c) => `${OPEN}\n${pythonJson({ name: c.name, arguments: c.arguments })}\n${CLOSE}`).join('\n');
  }
}

/** One call's JSON body → a call, or the reason it is unusable. */
function parseCallBody(raw: string): ToolCall | string {
  const body = raw.trim();
  if (body === '') return `empty ${OPEN}; ${EXPECTED}`;
  const parsed = parseModelJson(body);
  if ('error' in parsed) return parsed.tooDeep ? `JSON ${parsed.error}; ${EXPECTED}` : `invalid JSON (${parsed.error}); ${EXPECTED}, with double-quoted keys and strings and no trailing text`;
  const value = parsed.value;
  if (!isPlainObject(value)) return `expected one JSON object, got ${describe(value)}; ${EXPECTED}`;
  const name = value.name;
  if (typeof name !== 'string' || name.trim() === '') return `missing "name" (the tool name as a string); ${EXPECTED}`;
  const args = parseArguments(value.arguments ?? value.parameters);
  if (typeof args === 'string') return `${name}: ${args}`;
  return { name: name.trim(), arguments: args };
}

