import { afterReasoning, isPlainObject, occurrences, parseArguments, pythonJson, shortReason, describeJson as describe } from './call-json.js';
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
    const text = afterReasoning(message);
    const calls: ToolCall[] = [];
    const errors: string[] = [];
    let pos = 0;
    // The next closing tag at or after the current call's body (-1: none left). Kept between calls, so many opening
    // tags before one far closing tag do not each scan the text again: parsing stays linear in the text.
    let end = 0;
    for (let index = 1; ; index++) {
      const start = text.indexOf(OPEN, pos);
      if (start === -1) break;
      const bodyStart = start + OPEN.length;
      if (end !== -1 && end < bodyStart) end = text.indexOf(CLOSE, bodyStart);
      if (end === -1) {
        // No closing tag after it: this call and every later one are unclosed — one error for all of them.
        const later = occurrences(text, OPEN, bodyStart);
        errors.push(`tool call ${index}${later > 0 ? ` (and the ${later} after it)` : ''}: ${OPEN} is not closed by ${CLOSE}; ${EXPECTED}`);
        break;
      }
      const nextOpen = text.indexOf(OPEN, bodyStart);
      if (nextOpen !== -1 && nextOpen < end) {
        errors.push(`tool call ${index}: ${OPEN} is not closed by ${CLOSE}; ${EXPECTED}`);
        pos = nextOpen;
        continue;
      }
      const parsed = parseCallBody(text.slice(bodyStart, end));
      if (typeof parsed === 'string') errors.push(`tool call ${index}: ${parsed}`);
      else calls.push(parsed);
      pos = end + CLOSE.length;
    }
    return { calls, errors };
  }

  format(calls: readonly ToolCall[]): string {
    return calls.map((c) => `${OPEN}\n${pythonJson({ name: c.name, arguments: c.arguments })}\n${CLOSE}`).join('\n');
  }
}

/** One call's JSON body → a call, or the reason it is unusable. */
function parseCallBody(raw: string): ToolCall | string {
  const body = raw.trim();
  if (body === '') return `empty ${OPEN}; ${EXPECTED}`;
  let value: unknown;
  try {
    value = JSON.parse(body);
  } catch (err) {
    return `invalid JSON (${shortReason(err)}); ${EXPECTED}, with double-quoted keys and strings and no trailing text`;
  }
  if (!isPlainObject(value)) return `expected one JSON object, got ${describe(value)}; ${EXPECTED}`;
  const name = value.name;
  if (typeof name !== 'string' || name.trim() === '') return `missing "name" (the tool name as a string); ${EXPECTED}`;
  const args = parseArguments(value.arguments ?? value.parameters);
  if (typeof args === 'string') return `${name}: ${args}`;
  return { name: name.trim(), arguments: args };
}

