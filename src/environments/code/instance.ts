import { z } from 'zod';
import { parseInstance } from '../define.js';

/**
 * The instances of the "code" environment, in the two formats datasets use:
 *
 * - HumanEval format (OpenAI's HumanEval, MBPP ports, EvalPlus): `prompt` is a Python function signature with its
 *   docstring, `test` defines `check(candidate)` full of asserts, `entry_point` names the function; `task_id` is
 *   optional. Rows carry more columns (`canonical_solution`, ...): they are accepted and ignored.
 * - stdin/stdout format (competitive programming): a problem statement (`prompt`, or `statement`) and tests
 *   `[{input, output}]`; the program reads the input on stdin and is judged on its stdout.
 *
 * A bad row's error names a field of the format it resembles most (a row with `tests` is read as stdin/stdout).
 */

/** Longest prompt, test program or single test input/output accepted, characters. */
export const MAX_CODE_TEXT = 1_000_000;
/** Most stdin/stdout tests per instance. */
export const MAX_TESTS = 1000;
/** Default time limit of a HumanEval-format test program, seconds (OpenAI's harness uses 3 s on idle machines). */
export const DEFAULT_PROGRAM_TIMEOUT_S = 10;
/** Default time limit of one stdin/stdout test, seconds (Python's usual allowance on judges). */
export const DEFAULT_TEST_TIME_LIMIT_S = 4;
/** Default address-space limit of one test process, MiB. */
export const DEFAULT_MEMORY_LIMIT_MB = 1024;

const text = (max = MAX_CODE_TEXT) => z.string().max(max, { error: `must be at most ${max} characters` });
const nonEmpty = (max = MAX_CODE_TEXT) => text(max).refine((s) => s.trim() !== '', { error: 'must not be empty' });
/**
 * A time limit: at least 0.1 s (python3 alone takes tens of ms to start, more on a loaded node: a smaller limit, or
 * milliseconds written where seconds are meant, would time out every solution, reward 0 for a broken task), at most 120 s.
 */
export const MIN_TIME_LIMIT_S = 0.1;
const seconds = z
  .number()
  .min(MIN_TIME_LIMIT_S, { error: `must be at least ${MIN_TIME_LIMIT_S} seconds (python3 alone takes tens of ms to start)` })
  .max(120, { error: 'must be at most 120 seconds' });
const memoryMb = z.number().int().min(32, { error: 'must be at least 32 MiB' }).max(65_536);

/**
 * Whether a HumanEval-format test program defines `check` (a `def` or an assignment at the start of a line), read as
 * text: Python is not parsed here. A test without one would fail every solution; one that only looks as if it had one
 * (the `def` inside a string) is caught by the harness, as the task's fault (environment_error).
 */
const DEFINES_CHECK = /^[ \t]*(?:(?:async[ \t]+)?def[ \t]+check[ \t]*\(|check[ \t]*=[^=])/m;

/** Longest entry_point accepted: a function name, shown in the harness's messages. */
const MAX_ENTRY_POINT = 256;

/**
 * Names no Python function can have (hard keywords, and __debug__, which cannot be assigned): a task naming one would
 * fail every solution. Soft keywords (match, case, type, _) are ordinary names.
 */
const PYTHON_KEYWORDS = new Set([
  'False', 'None', 'True', 'and', 'as', 'assert', 'async', 'await', 'break', 'class', 'continue', 'def', 'del', 'elif', 'else',
  'except', 'finally', 'for', 'from', 'global', 'if', 'import', 'in', 'is', 'lambda', 'nonlocal', 'not', 'or', 'pass',
  'raise', 'return', 'try', 'while', 'with', 'yield', '__debug__',
]);

export const humanEvalInstanceSchema = z
  .object({
    task_id: text(200).optional(),
    prompt: nonEmpty().describe('Python source: the function signature and docstring to complete (plus imports and helpers).'),
    test: nonEmpty().describe('Python source defining check(candidate), which asserts on the candidate function.'),
    entry_point: z
      .string()
      .max(MAX_ENTRY_POINT, { error: `must be at most ${MAX_ENTRY_POINT} characters` })
      .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, { error: 'must be a Python identifier' })
      .refine((name) => !PYTHON_KEYWORDS.has(name), { error: (issue) => `${String(issue.input)} is a Python keyword: no function can have that name` })
      .describe('Name of the function under test.'),
    timeout_s: seconds.optional().describe(`Time limit of the whole test program, seconds (default ${DEFAULT_PROGRAM_TIMEOUT_S}).`),
    memory_limit_mb: memoryMb.optional().describe(`Address-space limit of the test process, MiB (default ${DEFAULT_MEMORY_LIMIT_MB}).`),
  })
  // On the whole row (it runs once every field is right), so a row missing fields is told about those first.
  .refine((row) => DEFINES_CHECK.test(row.test), { path: ['test'], error: 'must define check(candidate), the function the harness calls' })
  .transform((row) => ({
    format: 'humaneval' as const,
    taskId: row.task_id,
    prompt: row.prompt,
    test: row.test,
    entryPoint: row.entry_point,
    timeoutS: row.timeout_s ?? DEFAULT_PROGRAM_TIMEOUT_S,
    memoryLimitMb: row.memory_limit_mb ?? DEFAULT_MEMORY_LIMIT_MB,
  }));

const toleranceValue = z.number().min(0, { error: 'must be at least 0' });
/**
 * A number: both tolerances (Codeforces' "absolute or relative error at most ε", Kattis's `float_tolerance`); an
 * object: either or both. See judge.ts's FloatTolerance.
 */
const floatTolerance = z.union([
  toleranceValue.max(1, { error: 'must be at most 1 (give {absolute} for a larger absolute tolerance)' }),
  z
    .strictObject({
      absolute: toleranceValue.optional().describe('Largest absolute error |got − expected| accepted.'),
      relative: toleranceValue.max(1, { error: 'must be at most 1' }).optional().describe('Largest relative error |got − expected| / |expected| accepted.'),
    })
    .refine((t) => t.absolute !== undefined || t.relative !== undefined, { error: 'give absolute, relative or both' }),
]);

const ioTest = z.object({
  input: text().describe('Everything the program reads on stdin.'),
  output: text().describe('The expected stdout, compared token by token (see docs/environments/code.md).'),
});

export const stdioInstanceSchema = z
  .object({
    task_id: text(200).optional(),
    prompt: nonEmpty().optional().describe('The problem statement (or give it as `statement`).'),
    statement: nonEmpty().optional().describe('Alias of `prompt`, as competitive-programming sets name it.'),
    tests: z.array(ioTest).min(1, { error: 'must hold at least one test' }).max(MAX_TESTS, { error: `must hold at most ${MAX_TESTS} tests` }),
    time_limit_s: seconds.optional().describe(`Time limit of one test, seconds (default ${DEFAULT_TEST_TIME_LIMIT_S}).`),
    memory_limit_mb: memoryMb.optional().describe(`Address-space limit of one test process, MiB (default ${DEFAULT_MEMORY_LIMIT_MB}).`),
    float_tolerance: floatTolerance
      .optional()
      .describe('Numbers in the output accepted within this absolute or relative error of the expected ones: a number for both, or {absolute, relative}. Off by default (numbers compared as text).'),
  })
  .refine((row) => row.prompt !== undefined || row.statement !== undefined, { error: 'required', path: ['prompt'] })
  .transform((row) => ({
    format: 'stdio' as const,
    taskId: row.task_id,
    prompt: (row.prompt ?? row.statement)!,
    tests: row.tests,
    timeLimitS: row.time_limit_s ?? DEFAULT_TEST_TIME_LIMIT_S,
    memoryLimitMb: row.memory_limit_mb ?? DEFAULT_MEMORY_LIMIT_MB,
    floatTolerance: typeof row.float_tolerance === 'number' ? { absolute: row.float_tolerance, relative: row.float_tolerance } : row.float_tolerance,
  }));

/** Either format; a union so ListEnvironments shows both as `anyOf`. */
export const codeInstanceSchema = z.union([humanEvalInstanceSchema, stdioInstanceSchema]);

export type HumanEvalTask = z.output<typeof humanEvalInstanceSchema>;
export type StdioTask = z.output<typeof stdioInstanceSchema>;
export type CodeInstance = HumanEvalTask | StdioTask;

/**
 * Validates a row of either format and returns the normalised task; throws RolloutError.invalid('<root>.<field>',
 * why) naming a field of the format the row resembles (see defineEnvironment on unions).
 */
export function validateCodeInstance(value: unknown, root = 'instance'): CodeInstance {
  return parseInstance(codeInstanceSchema, value, root);
}
