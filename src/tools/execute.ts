import { classifyThrown, RolloutError, throwIfAborted, type ErrorCode } from '../errors.js';
import { isSandboxLimitError } from '../sandboxes/limit-errors.js';
import { isValidatedTool, type ArgsCheck, type ValidatedTool } from './define-tool.js';
import type { ToolTimeBudget } from './tool-time-budget.js';
import type { ParsedToolCalls, Tool, ToolCall, ToolContext, ToolResult } from './types.js';

/** A tool result, or 'malformed' when the call itself was unusable (bad JSON, unknown tool, bad arguments). */
export type ToolOutcome = ToolResult['outcome'] | 'malformed';

/** What one tool call (or one malformed call) shows the model. */
export interface ToolObservation {
  /** The called tool's name; empty when the call could not be parsed far enough to have one. */
  toolName: string;
  outcome: ToolOutcome;
  output: string;
  /** For outcome 'finish': the submitted answer. */
  answer?: string;
}

/**
 * Runs the parsed calls of one assistant message, in order, one after another (they share a sandbox, so a later
 * call may depend on an earlier one), and returns one observation per call, then one per parse error.
 *
 * The model's mistakes become observations, never throws: an unknown tool name ('malformed', listing the
 * available tools), arguments that do not fit the tool's schema ('malformed', with the reason), a failing
 * program ('error'), a sandbox the model filled to its own process or memory limit ('error', SandboxLimitError —
 * also when that killed the sandbox: every later call then says so). Infrastructure failures (sandbox stopped, wall clock used up, abort) do throw, as a
 * RolloutError, so they are never scored as the model's fault. Calls after a `finish` are not run: the episode
 * is over. At most `options.maxCallsPerMessage` (the server's `maxToolCallsPerMessage`, default
 * MAX_CALLS_PER_MESSAGE) calls of a message are run; the rest are counted in one observation. A tool that breaks
 * its own contract (validate() throws or answers out of shape, run() answers out of shape) is the environment's
 * failure: environment_error, like a tool that throws.
 *
 * With `options.toolTime` (the episode's tool-time budget) each call runs on its budgeted sandbox and is charged what
 * it took; once the budget is used up the remaining calls are not run (one 'error' observation each): the agent loop
 * then ends the episode TRUNCATED.
 */
export async function executeToolCalls(
  parsed: ParsedToolCalls,
  tools: readonly Tool[],
  context: ToolContext,
  options: ExecuteOptions = {},
): Promise<ToolObservation[]> {
  const maxCalls = options.maxCallsPerMessage ?? MAX_CALLS_PER_MESSAGE;
  const byName = new Map(tools.map((t) => [t.name, t]));
  const observations: ToolObservation[] = [];
  const budget = options.toolTime;
  const callContext: ToolContext = budget ? { ...context, sandbox: budget.sandbox } : context;
  let finished = false;
  for (const call of parsed.calls.slice(0, maxCalls)) {
    if (finished) {
      observations.push({ toolName: call.name, outcome: 'error', output: 'Not run: finish was already called in this message.' });
      continue;
    }
    if (budget?.exhausted === true) {
      observations.push({ toolName: call.name, outcome: 'error', output: `Not run: the episode's tool-time budget (${budget.budgetMs} ms) is used up.` });
      continue;
    }
    throwIfAborted(context.signal);
    const started = performance.now();
    let observation: ToolObservation;
    try {
      observation = await executeOne(call, byName, callContext);
    } finally {
      budget?.charge(performance.now() - started);
    }
    finished = observation.outcome === 'finish';
    observations.push(observation);
  }
  const notRun = parsed.calls.length - maxCalls;
  if (notRun > 0 && !finished) {
    observations.push({
      toolName: '',
      outcome: 'malformed',
      output: `Error: ${notRun} more tool calls in this message were not run (at most ${maxCalls} per message); call them again in your next message if you still need them.`,
    });
  }
  // One message per problem, up to a few: a degenerate completion (thousands of opening tags) must not become
  // thousands of observations the context then carries.
  for (const error of parsed.errors.slice(0, MAX_ERROR_OBSERVATIONS)) observations.push({ toolName: '', outcome: 'malformed', output: `Error: ${error}` });
  const unlisted = parsed.errors.length - MAX_ERROR_OBSERVATIONS;
  if (unlisted > 0) observations.push({ toolName: '', outcome: 'malformed', output: `Error: ${unlisted} more malformed tool calls in this message (not listed)` });
  return observations;
}

export interface ExecuteOptions {
  /** Calls of one message that are run (default MAX_CALLS_PER_MESSAGE); the server passes `maxToolCallsPerMessage`. */
  maxCallsPerMessage?: number;
  /** The episode's tool-time budget (see ToolTimeBudget); none: calls are bounded by their own timeouts only. */
  toolTime?: ToolTimeBudget;
}

/**
 * Default of the calls of one message that are run; the rest are answered by one observation. Why a bound: a degenerate completion
 * of short calls (~20 tokens each) would otherwise run thousands of programs and carry a page of output per call into
 * the context (~100 observation tokens per sampled token), all tokenized before the budget can refuse them.
 */
export const MAX_CALLS_PER_MESSAGE = 16;

/** Parse problems reported one observation each; the rest are counted in one more. */
export const MAX_ERROR_OBSERVATIONS = 8;

const INFRASTRUCTURE = new Set<ErrorCode>(['cancelled', 'deadline_exceeded', 'sandbox_error', 'backend_error', 'environment_error', 'resource_exhausted']);

async function executeOne(call: ToolCall, byName: ReadonlyMap<string, Tool>, context: ToolContext): Promise<ToolObservation> {
  const tool = byName.get(call.name);
  if (!tool) {
    const available = [...byName.keys()].join(', ') || '(none)';
    return { toolName: call.name, outcome: 'malformed', output: `Error: unknown tool "${call.name}". Available tools: ${available}.` };
  }
  let args = call.arguments;
  if (isValidatedTool(tool)) {
    const check = validateArgs(tool, args);
    if (!check.ok) return { toolName: call.name, outcome: 'malformed', output: `Error: ${check.reason}` };
    args = check.args;
  }
  let result: ToolResult;
  try {
    result = await tool.run(args, context);
  } catch (err) {
    // The sandbox at its own process or memory limit (the model filled it): the model's outcome, which it sees.
    if (isSandboxLimitError(err)) return { toolName: call.name, outcome: 'error', output: `Error: ${err.message}` };
    // Not the model's fault: a tool that throws is broken or its sandbox is; the trajectory must fail loudly.
    // Aborts and infrastructure codes keep their meaning; anything else is the environment's failure (never
    // INVALID_TASK: the task was valid, a tool broke).
    const e = classifyThrown(err, 'environment_error', context.signal);
    throw INFRASTRUCTURE.has(e.code) ? e : new RolloutError('environment_error', `tool ${call.name} failed: ${e.message}`, { cause: e });
  }
  const problem = resultProblem(result);
  if (problem !== undefined) throw new RolloutError('environment_error', `tool ${call.name} failed: returned an invalid result (${problem})`);
  return {
    toolName: call.name,
    outcome: result.outcome,
    output: result.output,
    ...(result.answer !== undefined && { answer: result.answer }),
  };
}

/**
 * A validated tool's verdict on the arguments. Its validate() is the tool's (often a plugin's) code, so one that throws
 * or answers out of shape is the environment's failure, never the model's and never an uncaught TypeError.
 */
function validateArgs(tool: ValidatedTool, args: Record<string, unknown>): ArgsCheck {
  let check: unknown;
  try {
    check = tool.validate(args);
  } catch (err) {
    throw new RolloutError('environment_error', `tool ${tool.name} failed: validate threw: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
  const c = check as Partial<{ ok: unknown; reason: unknown; args: unknown }> | null | undefined;
  if (c?.ok === false && typeof c.reason === 'string') return { ok: false, reason: c.reason };
  if (c?.ok === true && typeof c.args === 'object' && c.args !== null && !Array.isArray(c.args)) return { ok: true, args: c.args as Record<string, unknown> };
  throw new RolloutError('environment_error', `tool ${tool.name} failed: validate returned ${describeValue(check)}, not { ok: true, args } or { ok: false, reason }`);
}

const OUTCOMES = new Set<unknown>(['ok', 'error', 'finish']);

/** What is wrong with a tool's result (it becomes the model's context as it is), or undefined. */
function resultProblem(result: unknown): string | undefined {
  if (typeof result !== 'object' || result === null) return `${describeValue(result)}, not an object`;
  const r = result as Partial<Record<keyof ToolResult, unknown>>;
  if (typeof r.output !== 'string') return `output is ${describeValue(r.output)}, not a string`;
  if (!OUTCOMES.has(r.outcome)) return `outcome is ${describeValue(r.outcome)}, not ok, error or finish`;
  if (r.answer !== undefined && typeof r.answer !== 'string') return `answer is ${describeValue(r.answer)}, not a string`;
  return undefined;
}

function describeValue(value: unknown): string {
  if (value === null || value === undefined) return String(value);
  if (typeof value === 'string') return JSON.stringify(value.slice(0, 40));
  return typeof value === 'object' ? (Array.isArray(value) ? 'an array' : 'an object of another shape') : `${typeof value} ${String(value).slice(0, 40)}`;
}
