import { afterReasoning, isPlainObject, parseArguments, parseModelJson, parseTaggedCalls, pythonJson, skipSpace, taggedCallAround } from './call-json.js';
import type { ParsedToolCalls, ToolCall, ToolCallParser } from './types.js';

const CALLS_BEGIN = '<｜tool▁calls▁begin｜>';
const CALLS_END = '<｜tool▁calls▁end｜>';
const CALL_BEGIN = '<｜tool▁call▁begin｜>';
const CALL_END = '<｜tool▁call▁end｜>';
const SEP = '<｜tool▁sep｜>';
const EXPECTED = `write ${CALLS_BEGIN}${CALL_BEGIN}function${SEP}<tool name>\\n\`\`\`json\\n{...}\\n\`\`\`${CALL_END}${CALLS_END}`;
const FENCE = '```';

/**
 * Parses DeepSeek-V3's tool-call form, as its chat template writes assistant tool calls and vLLM's `deepseek_v3`
 * parser reads them:
 *
 *     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>python
 *     ```json
 *     {"code": "print(1)"}
 *     ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
 *
 * (all of <｜…｜> are single added tokens of the DeepSeek-V3 vocabulary). There are calls only after
 * `<｜tool▁calls▁begin｜>`, as in vLLM; text before it is content. Each `<｜tool▁call▁begin｜>…<｜tool▁call▁end｜>`
 * is one call; a missing end, separator or code fence, bad JSON or a type other than `function` is an error
 * numbered by position, never a throw. A missing `<｜tool▁calls▁end｜>` is tolerated (a length stop may cut it).
 *
 * The markers inside a call's JSON strings (code that writes this format) are argument text: the tokenizer turns the
 * markers' text into their added-token ids wherever it stands, JSON strings included, so the model learned to sample
 * those very ids there, and neither text nor ids tell them from the format's own. A call ends at the
 * `<｜tool▁call▁end｜>` after its arguments' JSON value and closing fence (at the first one when its JSON does not
 * close), and the block at the first `<｜tool▁calls▁end｜>` outside every call.
 */
export class DeepSeekV3ToolCallParser implements ToolCallParser {
  readonly name = 'deepseek_v3';

  parse(message: string): ParsedToolCalls {
    const text = afterReasoning(message, (t, at) => taggedCallAround(t, at, CALL_BEGIN, argumentsStart));
    const begin = text.indexOf(CALLS_BEGIN);
    if (begin < 0) return { calls: [], errors: [] };
    // The block ends at the first calls-end outside a call: one inside a call's JSON strings is argument text.
    const region = text.slice(begin + CALLS_BEGIN.length);
    const parsed = parseTaggedCalls(region, CALL_BEGIN, CALL_END, EXPECTED, parseBody, { jsonStart: argumentsStart, afterJson: FENCE, blockEnd: CALLS_END });
    if (parsed.calls.length === 0 && parsed.errors.length === 0) parsed.errors.push(`${CALLS_BEGIN} holds no ${CALL_BEGIN}; ${EXPECTED}`);
    return parsed;
  }

  /** The template's own form: calls joined by "\n" inside one calls block. */
  format(calls: readonly ToolCall[]): string {
    const one = (c: ToolCall): string => `${CALL_BEGIN}function${SEP}${c.name}\n\`\`\`json\n${pythonJson(c.arguments)}\n\`\`\`${CALL_END}`;
    return `${CALLS_BEGIN}${calls.map(one).join('\n')}${CALLS_END}`;
  }
}

/**
 * One call's body between CALL_BEGIN and CALL_END: `<type><SEP><name>`, a newline, the arguments in a code fence
 * (```json or ```), whitespace allowed around each part, the type and the name on one line each. Read by hand: the
 * regular expression it replaces backtracked cubically on a body of spaces (a 28-token completion took 5 s of the
 * event loop).
 */
function parseBody(raw: string): ToolCall | string {
  const bad = `expected function${SEP}<tool name>, a newline and the arguments in a \`\`\`json block; ${EXPECTED}`;
  const sep = raw.indexOf(SEP);
  if (sep < 0) return bad;
  const type = raw.slice(0, sep).trim();
  if (type.includes('\n')) return bad;
  const afterSep = raw.slice(sep + SEP.length);
  let rest = afterSep.trimStart();
  let name = '';
  if (rest.startsWith(FENCE)) {
    // No name: the fence must still be on a line of its own.
    if (!afterSep.slice(0, afterSep.length - rest.length).includes('\n')) return bad;
  } else {
    const newline = rest.indexOf('\n');
    if (newline < 0) return bad;
    name = rest.slice(0, newline).trim();
    rest = rest.slice(newline + 1).trimStart();
    if (!rest.startsWith(FENCE)) return bad;
  }
  let open = FENCE.length;
  if (rest.startsWith('json', open)) open += 'json'.length;
  const afterOpen = rest.slice(open);
  const leading = afterOpen.slice(0, afterOpen.length - afterOpen.trimStart().length);
  const lineEnd = leading.lastIndexOf('\n');
  if (lineEnd < 0) return bad;
  const fenced = afterOpen.slice(lineEnd + 1).trimEnd();
  if (!fenced.endsWith(FENCE) || fenced.length < FENCE.length) return bad;
  const json = fenced.slice(0, -FENCE.length).trimEnd();
  if (type !== 'function') return `unknown call type ${JSON.stringify(type)} (only "function"); ${EXPECTED}`;
  if (name === '') return `missing the tool name after ${SEP}; ${EXPECTED}`;
  const parsed = parseModelJson(json);
  if ('error' in parsed) return parsed.tooDeep ? `${name}: JSON arguments ${parsed.error}; ${EXPECTED}` : `${name}: invalid JSON arguments (${parsed.error}); ${EXPECTED}`;
  const value = parsed.value;
  const args = isPlainObject(value) ? value : parseArguments(value);
  if (typeof args === 'string') return `${name}: ${args}`;
  return { name, arguments: args };
}

/** How far after a call's opening tag its arguments' JSON may open (the type, separator, name and fence line). */
const MAX_HEADER_CHARS = 512;

/**
 * Where the arguments' JSON value opens in the call body starting at `from`: after `<type><SEP><name>`, a newline and
 * the fence line, when the value is an object, an array or a string (arguments written as a JSON string holding the
 * object); -1 otherwise (the body is then cut at its first end tag).
 * Looks at most {@link MAX_HEADER_CHARS} characters, so a text of many opening tags stays linear.
 */
function argumentsStart(text: string, from: number): number {
  const header = text.slice(from, from + MAX_HEADER_CHARS);
  const sep = header.indexOf(SEP);
  if (sep < 0) return -1;
  const fence = header.indexOf(FENCE, sep + SEP.length);
  if (fence < 0 || !header.slice(sep + SEP.length, fence).includes('\n')) return -1;
  let open = fence + FENCE.length;
  if (header.startsWith('json', open)) open += 'json'.length;
  const at = skipSpace(header, open);
  if (!header.slice(open, at).includes('\n') || (header[at] !== '{' && header[at] !== '[' && header[at] !== '"')) return -1;
  return from + at;
}
