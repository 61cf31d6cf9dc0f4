import { MATH_QUESTION_PATTERN, hashInts, seededRandom } from './arithmetic.js';

/** What a scripted policy knows about the request it answers. */
export interface PolicyContext {
  /** The request's `seed`, or a per-engine counter when the request has none. */
  seed: number;
  /** The prompt as token ids (the decoded text is the policy's first argument). */
  promptIds: readonly number[];
  /** A uniform [0, 1) stream fixed by the seed and the prompt length: replaying a request replays the answer. */
  random: () => number;
}

/**
 * A scripted stand-in for the model: the assistant text to produce for a prompt (without the closing
 * <|im_end|>, which the engine appends). Used by FakeVllmEngine to drive real agent loops without a GPU.
 *
 * @example
 * const echo: FakePolicy = (prompt) => `You said ${prompt.length} characters.`;
 */
export type FakePolicy = (promptText: string, ctx: PolicyContext) => string;

export interface ScriptedMathPolicyOptions {
  /** Probability that the final answer is off by a few (so GRPO groups get varied rewards). */
  wrongAnswerRate?: number;
  /** Probability that a tool call is not valid JSON (exercises the parser's error-observation path). */
  malformedToolCallRate?: number;
  /** Name of the tool the policy calls; its `code` argument is `print(<expression>)`. */
  toolName?: string;
  /**
   * Probability of computing through the `bash` tool (`python3 -c 'print(...)'` in the persistent shell) instead
   * of `python`; default 0. The demo uses it so both sandboxed tools run.
   */
  bashRate?: number;
}

/** One Qwen/Hermes tool call, exactly as Qwen chat models write it. */
export function hermesToolCall(name: string, args: Record<string, unknown>): string {
  return `<tool_call>\n${pythonJson({ name, arguments: args })}\n</tool_call>`;
}

/** JSON with Python's `json.dumps` spacing (`{"a": 1, "b": 2}`), the form Qwen models were trained to emit. */
function pythonJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(pythonJson).join(', ')}]`;
  if (typeof value === 'object' && value !== null) {
    return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${pythonJson(v)}`).join(', ')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

/** The content of the last <tool_response> block, or undefined if the prompt has none. */
export function latestToolResponse(promptText: string): string | undefined {
  const start = promptText.lastIndexOf('<tool_response>');
  if (start < 0) return undefined;
  const end = promptText.indexOf('</tool_response>', start);
  return promptText.slice(start + '<tool_response>'.length, end < 0 ? undefined : end).trim();
}

/**
 * A math "agent" for the python tool, scripted:
 * - no tool response yet: it calls the tool, `<tool_call>\n{"name": "python", "arguments": {"code":
 *   "print(17 * 23 + 5)"}}\n</tool_call>` (malformed JSON with probability `malformedToolCallRate`);
 * - after a numeric tool response N: `The answer is \boxed{N}.` (N off by 1–9 with probability `wrongAnswerRate`);
 * - after a non-numeric tool response (an error observation): it tries the call again.
 * It finds the problem as the first `What is <expression>?` in the prompt (see `mathProblem`), and answers
 * `I cannot find a problem to solve.` when there is none. Decisions depend only on the context's random stream.
 */
export function createScriptedMathPolicy(options: ScriptedMathPolicyOptions = {}): FakePolicy {
  const wrongRate = options.wrongAnswerRate ?? 0.2;
  const malformedRate = options.malformedToolCallRate ?? 0.1;
  const tool = options.toolName ?? 'python';
  const bashRate = options.bashRate ?? 0;
  return (promptText, ctx) => {
    const problem = MATH_QUESTION_PATTERN.exec(promptText)?.[1]?.trim();
    if (problem === undefined) return 'I cannot find a problem to solve.';
    const observation = latestToolResponse(promptText);
    if (observation !== undefined && /^-?\d+(\.\d+)?$/.test(observation)) {
      let answer = Number(observation);
      if (ctx.random() < wrongRate) answer += 1 + Math.floor(ctx.random() * 9);
      return `The answer is \\boxed{${answer}}.`;
    }
    const call =
      bashRate > 0 && ctx.random() < bashRate
        ? hermesToolCall('bash', { command: `python3 -c 'print(${problem})'` })
        : hermesToolCall(tool, { code: `print(${problem})` });
    if (ctx.random() < malformedRate) return call.replace('}}\n</tool_call>', '}\n</tool_call>');
    return call;
  };
}

/** The default policy of FakeVllmEngine: the scripted math agent with 20% wrong answers, 10% malformed calls. */
export const scriptedMathPolicy: FakePolicy = createScriptedMathPolicy();

/** The context a policy gets for a request; exported so tests can call policies directly. */
export function policyContext(seed: number, promptIds: readonly number[]): PolicyContext {
  return { seed, promptIds, random: seededRandom(hashInts(seed, promptIds.length)) };
}
