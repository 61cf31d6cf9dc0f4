import { clipped, RolloutError } from '../../errors.js';
import { defaultToolRegistry, type ToolRegistry } from '../../tools/registry.js';
import { defineEnvironment } from '../define.js';
import { openGradingSandbox } from '../grading-sandbox.js';
import { reportedAnswer } from '../reported-answer.js';
import type { Environment, Evaluation } from '../types.js';
import { sharedCheckPool, type CheckPool } from './check-pool.js';
import { MAX_ANSWER_LENGTH } from './equivalence.js';
import { findFinalAnswer } from './extract.js';
import { mathInstanceSchema, type MathChecker, type MathInstance } from './instance.js';
import { findMathVerify, mathVerifyMounts, runMathVerify, type MathVerifyInstallation } from './math-verify-checker.js';

/** Tools the math environment offers, by name; the system prompt refers to them. */
export const MATH_TOOL_NAMES = ['python', 'bash', 'finish'] as const;

export const MATH_SYSTEM_PROMPT = [
  'You are solving a math problem. Reason step by step.',
  'You may call the `python` tool to run Python code (for arithmetic, algebra or checking your work), and the `bash` tool to run shell commands; their output is returned to you.',
  'When you are done, give the final answer in one of two ways: call the `finish` tool with the answer, or end your reply with the answer in \\boxed{}, e.g. \\boxed{\\frac{1}{2}}.',
  'Give the answer in simplest exact form (a fraction such as \\frac{1}{3}, not 0.333) unless the problem asks for a decimal.',
].join('\n');

export interface MathEnvironmentOptions {
  /**
   * Where the `python`, `bash` and `finish` tools come from (default: the built-in tool registry). Injected so that
   * tests and deployments can swap implementations; each sample gets fresh instances from the factories.
   */
  toolRegistry?: ToolRegistry;
  /** Replaces {@link MATH_SYSTEM_PROMPT}, e.g. for a model trained on a different answer convention. */
  systemPrompt?: string;
  /**
   * The checker of instances that do not name one (`instance.checker`). Default `builtin`: always available, no
   * process per check. `math-verify` runs Hugging Face's math-verify in a fresh sandbox (math-verify-checker.ts)
   * and needs it installed (scripts/setup.sh); asking for it when it is not fails here, at start-up.
   */
  checker?: MathChecker;
  /** Where math-verify is installed; default {@link findMathVerify} of `mathVerifyVenv`. */
  mathVerify?: MathVerifyInstallation;
  /** The venv {@link findMathVerify} looks in; default ROLLOUT_MATH_VERIFY_VENV, else the project's .venvs/math-verify. */
  mathVerifyVenv?: string;
  /** Time for one math-verify check, ms (default 30 s); past it the sample is ENVIRONMENT_ERROR, never reward 0. */
  mathVerifyTimeoutMs?: number;
  /**
   * The threads the built-in checker runs on, off the event loop (check-pool.ts); a server gives its own and closes it
   * on stop. Default: a process-wide pool whose threads start with the first check and never keep the process alive.
   */
  checkPool?: CheckPool;
}

/**
 * The "math" environment: a problem with a reference answer; the model may use Python and a shell and answers with the
 * finish tool or \boxed{}. Reward is 1 when the answer is equivalent to the reference (see equivalence.ts),
 * else 0. No answer at all is reward 0 with has_answer 0: that is the model's failure, not the
 * infrastructure's, so it is a completed trajectory. The sample's sandbox is only used by the python and bash tools;
 * evaluation never touches it (math-verify runs in a fresh sandbox of its own).
 *
 * details: { correct: 0|1, has_answer: 0|1 }; report: { extracted, reference, method, checker, comparison } where
 * method is where the answer came from ('finish_tool' | 'boxed' | 'none'), checker is 'builtin' or 'math-verify',
 * and comparison is the built-in rule that decided (see equivalence.ts) or 'math-verify'. With math-verify the
 * report also holds what it parsed each side as (`parsed`) and the built-in checker's verdict (`builtin`), so a
 * run shows where the two disagree (null when the built-in check had no verdict), and `checker_limit` when the
 * answer's check ran past its bound (reward 0). The built-in checker runs on a checker thread (check-pool.ts): past
 * its CPU bound the answer is reward 0 with `checker_limit` too; a checker thread that dies or cannot start is
 * ENVIRONMENT_ERROR.
 * The model's answer is reported to MAX_REPORTED_ANSWER_CHARS, with `extracted_chars` (its length) when cut.
 *
 * @example
 * const math = createMathEnvironment(); // python, bash and finish from defaultToolRegistry()
 * const instance = math.validate({ problem: 'What is 1/2 + 1/4?', answer: '\\frac34' });
 */
export function createMathEnvironment(options: MathEnvironmentOptions = {}): Environment<MathInstance> {
  const systemPrompt = options.systemPrompt ?? MATH_SYSTEM_PROMPT;
  const toolRegistry = options.toolRegistry ?? defaultToolRegistry();
  const missing = MATH_TOOL_NAMES.filter((name) => !toolRegistry.has(name));
  if (missing.length > 0) throw new RolloutError('failed_precondition', `math environment needs tools: ${missing.join(', ')}`);
  const defaultChecker = options.checker ?? 'builtin';
  const mathVerify = options.mathVerify ?? findMathVerify(options.mathVerifyVenv);
  if (defaultChecker === 'math-verify' && !mathVerify) {
    throw new RolloutError('failed_precondition', 'math checker math-verify is not installed (scripts/setup.sh installs it into .venvs/math-verify)');
  }
  const checkerOf = (instance: MathInstance): MathChecker => instance.checker ?? defaultChecker;
  const checkPool = options.checkPool ?? sharedCheckPool();
  // On a server without math-verify, an instance asking for it is refused at submission, naming the field.
  const instanceSchema = mathVerify
    ? mathInstanceSchema
    : mathInstanceSchema.refine((i) => i.checker !== 'math-verify', { path: ['checker'], error: 'math-verify is not installed on this server (scripts/setup.sh installs it)' });
  return defineEnvironment({
    name: 'math',
    description: 'Math word problems with a reference answer; python and bash tools; reward 1 if the final answer (finish tool or \\boxed{}) is equivalent.',
    instance: instanceSchema,
    prompt: (i) => [
      { role: 'system', content: systemPrompt },
      { role: 'user', content: i.problem },
    ],
    // Built once and shared by every sample: these tools keep no per-sample state of their own (python's cell
    // counter is keyed by the sandbox, bash's state is the sandbox's shell) and have no dispose; building them
    // compiles zod schemas — measurable CPU and ~11 KiB per trajectory if done per sample.
    tools: MATH_TOOL_NAMES,
    toolRegistry,

    async evaluate({ instance, outcome, signal, openSandbox }): Promise<Evaluation> {
      const reference = String(instance.answer);
      const found = findFinalAnswer(outcome);
      if (!found) {
        return {
          reward: 0,
          details: { correct: 0, has_answer: 0 },
          report: { extracted: null, reference, method: 'none', checker: checkerOf(instance), comparison: 'none' },
        };
      }
      const builtinCheck = checkPool.check({ kind: 'equivalence', predicted: found.answer, reference }, signal);
      const report = { ...reportedAnswer(found.answer, MAX_REPORTED_ANSWER_CHARS), reference, method: found.source };
      if (checkerOf(instance) === 'builtin') {
        const builtin = await builtinCheck;
        if ('limit' in builtin) {
          return { reward: 0, details: { correct: 0, has_answer: 1 }, report: { ...report, checker: 'builtin', comparison: 'none', checker_limit: builtin.limit } };
        }
        const correct = builtin.result.equivalent ? 1 : 0;
        return { reward: correct, details: { correct, has_answer: 1 }, report: { ...report, checker: 'builtin', comparison: builtin.result.method } };
      }
      // With math-verify deciding, the built-in verdict is only reported: one it could not give is null, not a failure.
      const builtinVerdict = builtinCheck.then(
        (b) => ('limit' in b ? null : b.result.equivalent),
        () => null,
      );
      // In a fresh sandbox from the image with math-verify's packages bound in read-only, not in the episode's: what
      // the model left running there (or the memory and processes it used up) cannot break or sway the check.
      if (!mathVerify) throw new RolloutError('environment_error', 'math-verify is not installed on this server');
      const sandbox = await openGradingSandbox(openSandbox, 'math', { mounts: mathVerifyMounts(mathVerify) });
      const timeoutMs = options.mathVerifyTimeoutMs;
      const [verdict] = await runMathVerify(sandbox, [{ gold: reference, pred: found.answer }], { signal, ...(timeoutMs !== undefined && { timeoutMs }) });
      const correct = verdict!.equivalent ? 1 : 0;
      return {
        reward: correct,
        details: { correct, has_answer: 1 },
        report: {
          ...report,
          checker: 'math-verify',
          comparison: 'math-verify',
          parsed: { gold: verdict!.gold, pred: verdict!.pred.map(capText) },
          builtin: await builtinVerdict,
          ...(verdict!.limit !== undefined && { checker_limit: verdict!.limit }),
        },
      };
    },
  });
}

/**
 * Characters of the model's answer a report holds (the reference's own bound; longer answers compare as text only). The
 * answer is the policy's output: uncapped, a 1 MB answer went into every report, journal record and Watch event.
 */
export const MAX_REPORTED_ANSWER_CHARS = MAX_ANSWER_LENGTH;

/** `text` cut to MAX_REPORTED_ANSWER_CHARS with "…", never inside a surrogate pair. */
function capText(text: string): string {
  return clipped(text, MAX_REPORTED_ANSWER_CHARS, '…');
}
