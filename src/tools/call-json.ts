/**
 * JSON helpers the tool-call parsers share: reading a call's arguments, finding where one JSON value ends in
 * longer text, and writing JSON the way the models were trained to (Python's `json.dumps` spacing).
 */
import type { ParsedToolCalls, ToolCall } from './types.js';

/**
 * How deep the model's JSON may nest (arrays and objects inside one another). V8's JSON.parse reads any depth, but
 * every recursive walk after it — JSON.stringify, zod's z.json(), pythonJson, a tool's own canonicalization — overflows
 * the stack near 10,000 levels, and a RangeError thrown by a tool is an environment_error: the policy's output would
 * fail its trajectory as an infrastructure failure. Deeper JSON is a malformed call the model is told about. Real tool
 * arguments nest a few levels.
 */
export const MAX_JSON_DEPTH = 64;

/**
 * JSON.parse of text the model wrote (a call, its arguments), refusing nesting deeper than {@link MAX_JSON_DEPTH}
 * before it parses: the value, or why it is unusable (JSON.parse's reason, or "nested deeper than ..." with `tooDeep`).
 * Never throws.
 */
export function parseModelJson(text: string): { value: unknown } | { error: string; tooDeep: boolean } {
  if (jsonDepthExceeds(text, MAX_JSON_DEPTH)) return { error: TOO_DEEP, tooDeep: true };
  try {
    return { value: JSON.parse(text) as unknown };
  } catch (err) {
    return { error: shortReason(err), tooDeep: false };
  }
}

const TOO_DEEP = `nested deeper than ${MAX_JSON_DEPTH} levels of arrays and objects`;

/** Whether brackets outside strings nest deeper than `max` anywhere in `text` (a linear scan, no parse). */
function jsonDepthExceeds(text: string, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // backslash: skip the escaped character
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

/** A call's arguments: an object, a JSON string holding one (OpenAI-style encoded arguments), or absent (`{}`). */
export function parseArguments(value: unknown): Record<string, unknown> | string {
  if (value === undefined || value === null) return {};
  if (isPlainObject(value)) return value;
  if (typeof value === 'string') {
    if (value.trim() === '') return {};
    const parsed = parseModelJson(value);
    if ('error' in parsed) {
      return parsed.tooDeep ? `"arguments" is a string holding JSON ${parsed.error}; pass a shallower JSON object` : `"arguments" is a string that is not valid JSON (${parsed.error}); pass a JSON object`;
    }
    const inner = parsed.value;
    if (isPlainObject(inner)) return inner;
    return `"arguments" must be a JSON object of named arguments, got a string holding ${describeJson(inner)}`;
  }
  return `"arguments" must be a JSON object of named arguments, got ${describeJson(value)}`;
}

export function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** "null", "an array", "a number", ...: what a JSON value is, for error messages. */
export function describeJson(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return `a ${typeof value}`;
}

export function shortReason(err: unknown): string {
  const message = err instanceof Error ? err.message : String(err);
  return message.length > 120 ? `${message.slice(0, 117)}...` : message;
}

/** JSON with Python's `json.dumps` spacing (`{"a": 1, "b": 2}`), the form chat models were trained to emit. */
export function pythonJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(pythonJson).join(', ')}]`;
  if (typeof value === 'object' && value !== null) {
    return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${pythonJson(v)}`).join(', ')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

/**
 * Where the JSON object, array or string starting at `start` ends (one past its closing bracket or quote), found by
 * bracket depth outside strings, like Python's `JSONDecoder.raw_decode` (which vLLM's llama3_json parser uses) finds
 * the end of the first value; -1 when it does not close. The slice still has to pass JSON.parse.
 */
export function jsonValueEnd(text: string, start: number, limit = text.length): number {
  let depth = 0;
  let inString = false;
  for (let i = start; i < limit; i++) {
    const c = text[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') {
        inString = false;
        if (depth === 0) return i + 1; // the value was a string
      }
    } else if (c === '"') inString = true;
    else if (c === '{' || c === '[') depth++;
    else if (c === '}' || c === ']') {
      depth--;
      if (depth === 0) return i + 1;
    }
  }
  return -1;
}

/** How {@link parseTaggedCalls} finds where a call with tags in its JSON strings ends, and where the calls end. */
export interface TaggedCallsOptions {
  /**
   * Where the JSON value of the body starting at `bodyStart` opens, -1 when it has none there (default: the body's
   * first non-space character, when it is `{`). Must look at a bounded stretch of text: it runs once per opening tag.
   */
  jsonStart?: (text: string, bodyStart: number) => number;
  /** Text that follows the JSON value before the closing tag, whitespace around it allowed (a code fence). */
  afterJson?: string;
  /** A tag that ends the block of calls: an opening tag after it, outside every call, is not read. */
  blockEnd?: string;
}

/**
 * Every `open … close` call of `text`, in order, each body read by `parseBody`; linear in the text. An opening tag not
 * closed before the next one is an error; one with no closing tag after it at all is one error for it and every
 * later one (not one per tag). Errors are numbered by the call's position and end with `expected`. The next closing
 * tag is kept between calls, so many opening tags before one far closing tag do not each scan the text again.
 */
export function parseTaggedCalls(
  text: string,
  open: string,
  close: string,
  expected: string,
  parseBody: (body: string) => ToolCall | string,
  options: TaggedCallsOptions = {},
): ParsedToolCalls {
  const calls: ToolCall[] = [];
  const errors: string[] = [];
  const unclosed = `${open} is not closed by ${close}; ${expected}`;
  const { blockEnd, afterJson } = options;
  const jsonAt = options.jsonStart ?? ((t: string, from: number): number => (t[skipSpace(t, from)] === '{' ? skipSpace(t, from) : -1));
  let pos = 0;
  let end = 0; // the next closing tag at or after the current body; -1: none left
  let blockEndAt = 0; // the next blockEnd tag at or after pos; -1: none left
  let budget = 2 * text.length; // characters the JSON-aware ends below may scan in all (linear overall)
  for (let index = 1; ; index++) {
    const start = text.indexOf(open, pos);
    if (start === -1) break;
    if (blockEnd !== undefined && blockEndAt !== -1) {
      if (blockEndAt < pos) blockEndAt = text.indexOf(blockEnd, pos);
      if (blockEndAt !== -1 && blockEndAt < start) break; // the block of calls ended before this tag
    }
    const bodyStart = start + open.length;
    if (end !== -1 && end < bodyStart) end = text.indexOf(close, bodyStart);
    // A JSON body may hold the tags in its strings (a call writing this very format): it ends where its JSON ends,
    // when the closing tag follows there.
    const jsonStart = end === -1 || budget <= 0 ? -1 : jsonAt(text, bodyStart);
    if (jsonStart >= 0) {
      const limit = Math.min(text.length, jsonStart + budget);
      const jsonEnd = jsonValueEnd(text, jsonStart, limit);
      budget -= (jsonEnd < 0 ? limit : jsonEnd) - jsonStart;
      let after = jsonEnd < 0 ? -1 : skipSpace(text, jsonEnd);
      if (after >= 0 && afterJson !== undefined) after = text.startsWith(afterJson, after) ? skipSpace(text, after + afterJson.length) : -1;
      if (after >= end && text.startsWith(close, after)) {
        const parsed = parseBody(text.slice(bodyStart, after));
        if (typeof parsed === 'string') errors.push(`tool call ${index}: ${parsed}`);
        else calls.push(parsed);
        pos = after + close.length;
        end = 0;
        continue;
      }
    }
    if (end === -1) {
      let later = 0;
      for (let at = text.indexOf(open, bodyStart); at !== -1; at = text.indexOf(open, at + open.length)) later++;
      errors.push(`tool call ${index}${later > 0 ? ` (and the ${later} after it)` : ''}: ${unclosed}`);
      break;
    }
    const nextOpen = text.indexOf(open, bodyStart);
    if (nextOpen !== -1 && nextOpen < end) {
      errors.push(`tool call ${index}: ${unclosed}`);
      pos = nextOpen;
      continue;
    }
    const parsed = parseBody(text.slice(bodyStart, end));
    if (typeof parsed === 'string') errors.push(`tool call ${index}: ${parsed}`);
    else calls.push(parsed);
    pos = end + close.length;
  }
  return { calls, errors };
}

/**
 * The part of an assistant message a tool-call parser reads: what follows its reasoning. A model that reasons
 * inside `<think>…</think>` (Qwen3, DeepSeek-R1) may mention or draft a call there; as vLLM's reasoning parsers do,
 * reasoning is a block the message opens with, ended by the first `</think>` after it, and only the text after it
 * holds calls (a message that opens `<think>` and never closes it was cut inside its reasoning: it holds none). A
 * template may open the block in the prompt (DeepSeek-R1's, Qwen3-Thinking's): a message with no `<think>` of its own
 * reasoned up to its first `</think>` — calls drafted before it included, as the answer extraction (math/extract.ts
 * finalReply) reads it — unless that `</think>` lies inside a call (`openCallAround(text, at)`: where the format's call
 * holding position `at` opens, -1 when `at` is in none): a call whose arguments hold "<think>" or "</think>" (code
 * that handles reasoning tags) is read as the call it is, not hidden or cut in half.
 */
export function afterReasoning(text: string, openCallAround: (text: string, at: number) => number): string {
  const lead = text.length - text.trimStart().length;
  if (text.startsWith(THINK, lead)) {
    const end = text.indexOf(END_THINK, lead + THINK.length);
    return end >= 0 ? text.slice(end + END_THINK.length) : '';
  }
  const end = text.indexOf(END_THINK);
  if (end < 0) return text;
  return openCallAround(text, end) === -1 ? text.slice(end + END_THINK.length) : text;
}

/**
 * {@link afterReasoning}'s `openCallAround` for a format whose calls are `open …` tags followed by a JSON value: where
 * the call whose JSON holds position `at` opens, -1 when `at` is in none. Walks the opening tags before `at` in order,
 * each call's JSON value from where `jsonStart` (default: the first non-space character, when it is `{`) says it opens
 * to where it closes, so tags inside a call's strings are not taken for calls, and a tag with no JSON after it (one
 * mentioned in prose) holds nothing. An unclosed JSON value holds everything after it. Linear in the text.
 */
export function taggedCallAround(text: string, at: number, open: string, jsonStart: (text: string, bodyStart: number) => number = objectStart): number {
  for (let start = text.indexOf(open); start !== -1 && start + open.length <= at; ) {
    const json = jsonStart(text, start + open.length);
    if (json < 0 || json >= at) {
      start = text.indexOf(open, start + open.length);
      continue;
    }
    const end = jsonValueEnd(text, json);
    if (end === -1 || end > at) return start;
    start = text.indexOf(open, end);
  }
  return -1;
}

function objectStart(text: string, from: number): number {
  const at = skipSpace(text, from);
  return text[at] === '{' ? at : -1;
}

/** The first index at or after `from` that is not JSON whitespace (space, newline, tab, carriage return). */
export function skipSpace(text: string, from: number): number {
  let i = from;
  while (i < text.length && (text[i] === ' ' || text[i] === '\n' || text[i] === '\t' || text[i] === '\r')) i++;
  return i;
}
const THINK = '<think>';
const END_THINK = '</think>';
