import { z } from 'zod';
import type { Environment } from '../environments/types.js';
import type { ChatMessage } from '../tokens/types.js';
import { createMathEnvironment } from '../environments/math/math-environment.js';
import type { MathInstance } from '../environments/math/instance.js';
import { createFinishTool } from '../tools/finish-tool.js';
import { defineTool, type ValidatedTool } from '../tools/define-tool.js';
import { MATH_QUESTION_PATTERN, evaluateArithmetic } from './arithmetic.js';
import { hermesToolCall, latestToolResponse, type FakePolicy } from './scripted-policy.js';

/** Name under which {@link createCalcEnvironment} registers. */
export const CALC_ENVIRONMENT = 'bench-calc';

const CALC_SYSTEM_PROMPT = [
  'You are solving an arithmetic problem.',
  'You may call the `calc` tool with an integer expression (+, -, *, parentheses); it returns the value.',
  'Give the final answer in \\boxed{}, or call the `finish` tool with it.',
].join('\n');

/**
 * TEST DOUBLE tool: `calc` evaluates integer arithmetic in-process (no sandbox, no process), so a benchmark
 * measures the orchestration around tool calls rather than process spawning. A bad expression is the model's
 * mistake: outcome 'error' with the reason, never a throw.
 */
export function createCalcTool(): ValidatedTool {
  return defineTool({
    name: 'calc',
    description: 'Evaluates an integer arithmetic expression (+, -, *, parentheses) and returns its value.',
    args: z.object({ expression: z.string().describe('e.g. "17 * 23 + 5"') }),
    async run({ expression }) {
      try {
        return { output: String(evaluateArithmetic(expression)), outcome: 'ok' };
      } catch (err) {
        return { output: `Error: ${err instanceof Error ? err.message : String(err)}`, outcome: 'error' };
      }
    },
  });
}

/**
 * TEST DOUBLE environment for benchmarks and pipeline tests: the math environment's instances, validation and
 * grading (`\boxed{}` or finish, exact equivalence), but with the in-process {@link createCalcTool} instead of
 * `python`, so no sandbox process ever runs. Pair it with `NullSandboxDriver` and {@link calcPolicy}; it is
 * registered only by code that asks for it (never by `defaultRegistry`).
 *
 * @example
 * const registry = defaultRegistry().register(createCalcEnvironment());
 * const server = await startRolloutServer(config, { registry, sandboxes: new NullSandboxDriver() });
 */
export function createCalcEnvironment(): Environment<MathInstance> {
  const math = createMathEnvironment();
  const tools = [createCalcTool(), createFinishTool()];
  const prompt = (instance: MathInstance): ChatMessage[] => [
    { role: 'system', content: CALC_SYSTEM_PROMPT },
    { role: 'user', content: instance.problem },
  ];
  return {
    name: CALC_ENVIRONMENT,
    description: 'Benchmark double: arithmetic problems, in-process calc tool, graded like math.',
    instanceSchema: math.instanceSchema,
    toolNames: ['calc', 'finish'],
    validate: (instance) => math.validate(instance),
    prompt,
    async init({ instance }) {
      return { messages: prompt(instance) };
    },
    tools: () => tools,
    evaluate: (context) => math.evaluate(context),
  };
}

/**
 * TEST DOUBLE policy for FakeVllmEngine, made for {@link createCalcEnvironment}: exactly two assistant turns per
 * trajectory. Turn 1 calls `calc` with the problem's expression (the first `What is <expression>?` in the
 * prompt); turn 2, seeing a numeric tool response, answers `The answer is \boxed{N}.`; a non-numeric response
 * gets the call again. Always right, never malformed, so every trajectory is COMPLETED with reward 1.
 */
export const calcPolicy: FakePolicy = (promptText) => {
  const problem = MATH_QUESTION_PATTERN.exec(promptText)?.[1]?.trim();
  if (problem === undefined) return 'I cannot find a problem to solve.';
  const observation = latestToolResponse(promptText);
  if (observation !== undefined && /^-?\d+$/.test(observation)) return `The answer is \\boxed{${observation}}.`;
  return hermesToolCall('calc', { expression: problem });
};
