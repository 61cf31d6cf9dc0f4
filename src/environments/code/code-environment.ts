import type { ChatMessage } from '../../tokens/types.js';
import type { SandboxRequest } from '../../sandboxes/spec.js';
import type { ToolRegistry } from '../../tools/registry.js';
import { defineEnvironment } from '../define.js';
import { openGradingSandbox } from '../grading-sandbox.js';
import type { Environment, Evaluation } from '../types.js';
import type { JsonObject } from '../json.js';
import { findSolution } from './extract.js';
import { harnessOutputBytes, runHumanEvalTests } from './humaneval-runner.js';
import { codeInstanceSchema, type CodeInstance } from './instance.js';
import { runStdioTests } from './stdio-runner.js';
import type { FloatTolerance } from './judge.js';
import type { TestRun } from './test-run.js';

/** Tools the code environment offers, by name; the system prompts refer to them. */
export const CODE_TOOL_NAMES = ['python', 'bash', 'finish'] as const;

/** Per-test entries kept in the report (the counts in details cover every test). */
export const MAX_REPORTED_TESTS = 20;

const HOW_TO_ANSWER =
  'You may run code with the `python` and `bash` tools to try your solution. When you are done, either reply with the solution in one ```python code block (the last such block of your final reply is graded) or call `finish` with the code.';

export const HUMANEVAL_SYSTEM_PROMPT = [
  'You are an expert Python programmer. Complete the Python function the user gives you.',
  HOW_TO_ANSWER,
  'Submit the whole function (signature and body, with any imports or helper functions it needs) or just its body, indented as in the function.',
].join('\n');

export const STDIO_SYSTEM_PROMPT = [
  'You are an expert competitive programmer. Solve the problem with a complete Python 3 program that reads the input from standard input and writes the answer to standard output.',
  HOW_TO_ANSWER,
  'Print only what the output format asks for; spacing and line breaks between values do not matter.',
].join('\n');

/** Default wall time all the tests of one solution may take together: 5 minutes. */
export const DEFAULT_TEST_BUDGET_MS = 300_000;
/** Eval work around the tests: starting the fresh sandbox, checking its python3 (up to 30 s), writing the solution. */
export const CODE_EVAL_OVERHEAD_MS = 60_000;

export interface CodeEnvironmentOptions {
  /** Where the `python`, `bash` and `finish` tools come from (default: the built-in tool registry). */
  toolRegistry?: ToolRegistry;
  /**
   * Wall time all the tests of one solution may take together, ms (default {@link DEFAULT_TEST_BUDGET_MS}): past it
   * the remaining tests fail (the solution's slowness, reward 0). The environment's default eval budget is this plus
   * {@link CODE_EVAL_OVERHEAD_MS}, so per-test time limits that add up (many tests) end as a reward, never as the eval
   * stage's TIMEOUT; a task that sets a smaller `limits.eval_timeout_ms` gets TIMEOUT when its own budget ends first.
   */
  testBudgetMs?: number;
}

/** The first messages of a task. */
export function codePrompt(instance: CodeInstance): ChatMessage[] {
  if (instance.format === 'humaneval') {
    return [
      { role: 'system', content: HUMANEVAL_SYSTEM_PROMPT },
      { role: 'user', content: `Complete this function:\n\n\`\`\`python\n${withoutTrailingNewlines(instance.prompt)}\n\`\`\`` },
    ];
  }
  const limits = `Time limit: ${instance.timeLimitS} s per test. Memory limit: ${instance.memoryLimitMb} MiB.${toleranceNote(instance.floatTolerance)}`;
  return [
    { role: 'system', content: STDIO_SYSTEM_PROMPT },
    { role: 'user', content: `${withoutTrailingNewlines(instance.prompt)}\n\n${limits}` },
  ];
}

/** The prompt's sentence on a task's float tolerance ('' without one), so the model knows how exact to print. */
function toleranceNote(tolerance: FloatTolerance | undefined): string {
  if (!tolerance) return '';
  const { absolute, relative } = tolerance;
  const errors = [absolute !== undefined && `an absolute error of ${absolute}`, relative !== undefined && `a relative error of ${relative}`].filter(Boolean).join(' or ');
  return ` Numbers in your output are accepted within ${errors} of the expected ones.`;
}

/**
 * Memory a code sandbox holds beyond the task's `memory_limit_mb`, MiB: the judge's Python, the shell, the solution's
 * files in the tmpfs. The stated limit is the test process's address space (RLIMIT_AS), most of which it can make
 * resident; the sandbox's whole memory (its cgroup, or RLIMIT_AS of every process when the server runs without cgroups)
 * must hold that and the rest, or a correct solution using memory within its stated limit is killed by the sandbox's.
 */
export const CODE_SANDBOX_MEMORY_HEADROOM_MB = 256;

/**
 * What the tests' sandbox needs beyond the server's defaults: a per-command output cap that fits the largest
 * expected output twice over (a correct program must never be cut), at least 64 KiB; memory for a test process of the
 * task's `memory_limit_mb` and its judge ({@link CODE_SANDBOX_MEMORY_HEADROOM_MB}; a task needing more than the server's
 * `sandbox.maxMemoryMb` is refused at submit); no network (the default). The episode's sandbox gets the same memory, so
 * the model's own runs of its solution see the limit the prompt states.
 */
export function codeSandbox(instance: CodeInstance): SandboxRequest {
  const largest = instance.format === 'stdio' ? Math.max(...instance.tests.map((t) => Buffer.byteLength(t.output))) : 0;
  return {
    limits: { outputLimitBytes: Math.max(64 * 1024, 2 * largest + 4096) },
    minMemoryMb: instance.memoryLimitMb + CODE_SANDBOX_MEMORY_HEADROOM_MB,
  };
}

/**
 * The grading sandbox's request: the episode's ({@link codeSandbox}), with an output cap that also fits everything the
 * HumanEval harness may report for the task's tests (one line per test: a large test suite passed 64 KiB). Only the
 * grading sandbox gets it: the episode's commands keep the smaller cap.
 */
export function codeGradingSandbox(instance: CodeInstance): SandboxRequest {
  const request = codeSandbox(instance);
  if (instance.format !== 'humaneval') return request;
  const outputLimitBytes = Math.max(request.limits?.outputLimitBytes ?? 0, harnessOutputBytes(instance.test));
  return { ...request, limits: { ...request.limits, outputLimitBytes } };
}

/** Reward, details and report from a test run. */
function scored(run: TestRun, source: string, instance: CodeInstance): Evaluation {
  const total = run.tests.length;
  const passed = run.tests.filter((t) => t.passed).length;
  const allPassed = total > 0 && passed === total ? 1 : 0;
  const tests: JsonObject[] = run.tests.slice(0, MAX_REPORTED_TESTS).map((t) => ({
    index: t.index,
    status: t.status,
    ...(t.detail !== undefined && { detail: t.detail }),
    ...(t.timeMs !== undefined && { time_ms: t.timeMs }),
  }));
  return {
    reward: allPassed,
    details: { passed_all: allPassed, pass_fraction: total > 0 ? passed / total : 0, passed, total, has_code: 1 },
    report: {
      format: instance.format,
      ...(instance.taskId !== undefined && { task_id: instance.taskId }),
      ...(instance.format === 'stdio' && instance.floatTolerance && { float_tolerance: { ...instance.floatTolerance } }),
      source,
      tests,
      tests_omitted: Math.max(0, total - MAX_REPORTED_TESTS),
      duration_ms: Math.round(run.durationMs),
    },
  };
}

/**
 * The "code" environment: Python programming tasks in HumanEval format (complete a function; the task's
 * `check(candidate)` asserts on it) or stdin/stdout format (a full program judged on its output, test by test).
 * See instance.ts for the instance and docs/environments/code.md for the whole contract.
 *
 * The model may run code with `python` and `bash` and submits its solution in a ```python block of its final
 * reply or through `finish`. The tests run in a fresh sandbox from the same image (`openSandbox`: nothing the
 * episode left there, no network), with only the solution copied in, each test under a time limit and all of them
 * within `testBudgetMs` (the eval stage's default budget covers it).
 * Reward 1 iff every test passes; details { passed_all, pass_fraction, passed, total, has_code }; report
 * { format, task_id?, source, tests: first {@link MAX_REPORTED_TESTS} outcomes, tests_omitted, duration_ms }.
 * No code at all is reward 0 with has_code 0 — the model's failure, a completed trajectory. So are code that
 * does not compile, crashes, hangs, floods its output or exits early. Only an evaluation that could not run
 * (no python3 in the sandbox, a task whose own test code is broken, a failed sandbox) throws: ENVIRONMENT_ERROR
 * or SANDBOX_ERROR, never reward 0.
 *
 * @example
 * const code = createCodeEnvironment();
 * code.validate({ prompt: 'def add(a, b):\n    """Sum."""\n', test: 'def check(f):\n    assert f(1, 2) == 3\n', entry_point: 'add' });
 */
export function createCodeEnvironment(options: CodeEnvironmentOptions = {}): Environment<CodeInstance> {
  const testBudgetMs = options.testBudgetMs ?? DEFAULT_TEST_BUDGET_MS;
  return defineEnvironment({
    name: 'code',
    description:
      'Python coding tasks: HumanEval format {prompt, test, entry_point} or stdin/stdout format {prompt, tests: [{input, output}]}; python and bash tools; the solution (a ```python block or the finish tool) is tested in a fresh sandbox; reward 1 if every test passes.',
    instance: codeInstanceSchema,
    sandbox: codeSandbox,
    prompt: codePrompt,
    tools: CODE_TOOL_NAMES,
    ...(options.toolRegistry && { toolRegistry: options.toolRegistry }),
    stageTimeouts: { evalMs: testBudgetMs + CODE_EVAL_OVERHEAD_MS },
    async evaluate({ instance, outcome, signal, openSandbox }) {
      const solution = findSolution(outcome);
      if (!solution) {
        return {
          reward: 0,
          details: { passed_all: 0, pass_fraction: 0, passed: 0, total: instance.format === 'stdio' ? instance.tests.length : 0, has_code: 0 },
          report: { format: instance.format, ...(instance.taskId !== undefined && { task_id: instance.taskId }), source: 'none', tests: [] },
        };
      }
      // Graded in a fresh sandbox from the image, never in the episode's: a process the model left running or a
      // file it planted (or the memory and processes it used up) can neither fool nor break the tests.
      const sandbox = await openGradingSandbox(openSandbox, 'code', codeGradingSandbox(instance));
      const run =
        instance.format === 'humaneval'
          ? await runHumanEvalTests(sandbox, { ...instance, timeoutS: Math.min(instance.timeoutS, testBudgetMs / 1000) }, solution.code, signal)
          : await runStdioTests(sandbox, instance, solution.code, signal, { budgetMs: testBudgetMs });
      return scored(run, solution.source, instance);
    },
  });
}

/**
 * `text` without its trailing newlines, by a scan from the end (`replace(/\n+$/, '')` tries every run of newlines
 * in the text and is quadratic in a long run that does not reach the end: 2 s for a 64K-character prompt).
 */
function withoutTrailingNewlines(text: string): string {
  let end = text.length;
  while (end > 0 && text.charCodeAt(end - 1) === 10) end--;
  return text.slice(0, end);
}
