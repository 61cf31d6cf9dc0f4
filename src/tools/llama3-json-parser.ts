import { afterReasoning, describeJson, isPlainObject, jsonValueEnd, parseArguments, parseModelJson, pythonJson } from './call-json.js';
import type { ParsedToolCalls, ToolCall, ToolCallParser } from './types.js';

const PYTHON_TAG = '<|python_tag|>';
const EXPECTED = 'write only {"name": "<tool name>", "parameters": {...}} as the whole message';

/**
 * Parses Llama 3.1's JSON tool-call form, following vLLM's `llama3_json` parser: a message is a tool call when
 * it is, as a whole, a JSON object `{"name": ..., "parameters": {...}}` (or `"arguments"`), optionally after
 * `<|python_tag|>`; several calls are objects separated by `;` (and whitespace). Anything else is plain text.
 *
 * Where vLLM falls back to "no call, plain content" on a broken call, this parser reports an error the model
 * can fix when the message clearly meant a call (it starts with <|python_tag|>, or with `{` and mentions
 * `"name"`), because in an agent loop a plain answer ends the episode: a typo would silently end it.
 * Leading whitespace is ignored; text after the last object is an error. Never throws.
 */
export class Llama3JsonToolCallParser implements ToolCallParser {
  readonly name = 'llama3_json';

  parse(message: string): ParsedToolCalls {
    const text = afterReasoning(message, callAround);
    let body = text.trimStart();
    const tagged = body.startsWith(PYTHON_TAG);
    if (tagged) body = body.slice(PYTHON_TAG.length);
    else if (!body.startsWith('{') || !body.includes('"name"')) return { calls: [], errors: [] };
    const calls: ToolCall[] = [];
    const errors: string[] = [];
    let pos = skipSeparators(body, 0);
    for (let index = 1; pos < body.length; index++) {
      if (body[pos] !== '{') {
        errors.push(`tool call ${index}: expected a JSON object, found ${JSON.stringify(body.slice(pos, pos + 20))}; ${EXPECTED}`);
        break;
      }
      const end = jsonValueEnd(body, pos);
      if (end < 0) {
        errors.push(`tool call ${index}: the JSON object is not closed; ${EXPECTED}`);
        break;
      }
      const parsed = parseCall(body.slice(pos, end));
      if (typeof parsed === 'string') errors.push(`tool call ${index}: ${parsed}`);
      else calls.push(parsed);
      pos = skipSeparators(body, end);
    }
    if (calls.length === 0 && errors.length === 0) errors.push(`empty ${PYTHON_TAG} call; ${EXPECTED}`);
    return { calls, errors };
  }

  /** Llama 3.1's own form: the objects with `"parameters"`, joined by "; " (as vLLM's parser reads them). */
  format(calls: readonly ToolCall[]): string {
    return calls.map((c) => pythonJson({ name: c.name, parameters: c.arguments })).join('; ');
  }
}

function skipSeparators(text: string, from: number): number {
  let i = from;
  while (i < text.length && (text[i] === ';' || /\s/.test(text[i]!))) i++;
  return i;
}

function parseCall(raw: string): ToolCall | string {
  const parsed = parseModelJson(raw);
  if ('error' in parsed) return parsed.tooDeep ? `JSON ${parsed.error}; ${EXPECTED}` : `invalid JSON (${parsed.error}); ${EXPECTED}, with double-quoted keys and strings`;
  const value = parsed.value;
  if (!isPlainObject(value)) return `expected one JSON object, got ${describeJson(value)}; ${EXPECTED}`;
  const name = value.name;
  if (typeof name !== 'string' || name.trim() === '') return `missing "name" (the tool name as a string); ${EXPECTED}`;
  const args = parseArguments(value.parameters ?? value.arguments);
  if (typeof args === 'string') return `${name}: ${args.replace('"arguments"', '"parameters"')}`;
  return { name: name.trim(), arguments: args };
}

/**
 * Where the message's calls open when position `at` lies inside one of them (-1 otherwise): Llama 3.1's calls are the
 * whole message, objects from its start (after the python tag, if any) joined by `;`.
 */
function callAround(text: string, at: number): number {
  const body = text.trimStart();
  const start = text.length - body.length;
  if (!body.startsWith('{') && !body.startsWith(PYTHON_TAG)) return -1;
  let pos = skipSeparators(text, body.startsWith(PYTHON_TAG) ? start + PYTHON_TAG.length : start);
  while (pos < at && text[pos] === '{') {
    const end = jsonValueEnd(text, pos);
    if (end === -1 || end > at) return start;
    pos = skipSeparators(text, end);
  }
  return -1;
}
