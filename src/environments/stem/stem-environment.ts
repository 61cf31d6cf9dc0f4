import type { ChatMessage } from '../../tokens/types.js';
import type { ToolRegistry } from '../../tools/registry.js';
import { defineEnvironment } from '../define.js';
import { sharedCheckPool, type CheckOutcome, type CheckPool } from '../math/check-pool.js';
import type { CheckTask } from '../math/check-tasks.js';
import { reportedAnswer } from '../reported-answer.js';
import type { Environment, Evaluation } from '../types.js';
import { choiceByText, choiceLetter, findStemAnswer } from './choice.js';
import { DEFAULT_RELATIVE_TOLERANCE, stemInstanceSchema, type StemInstance } from './instance.js';
import { compareQuantity } from './quantity.js';
import { mathjsUnits, type UnitSystem } from './units.js';

/** Tools the STEM environment offers, by name; the system prompts refer to them. */
export const STEM_TOOL_NAMES = ['python', 'finish'] as const;

/** Characters of the model's answer a report holds (`extracted`; `extracted_chars` gives the length when cut). */
export const MAX_REPORTED_ANSWER_CHARS = 500;

export const STEM_CHOICE_SYSTEM_PROMPT = [
  'You are answering a multiple-choice science question. Reason step by step; you may call the `python` tool for calculations.',
  'When you are done, call `finish` with the letter of your choice, or end your reply with "The answer is (X)" where X is that letter.',
].join('\n');

export const STEM_NUMERIC_SYSTEM_PROMPT = [
  'You are answering a science or engineering question with a numerical answer. Reason step by step; you may call the `python` tool for calculations.',
  'When you are done, call `finish` with the number and its unit (e.g. `9.8 m/s^2` or `3.2e5 J`), or end your reply with them in \\boxed{}, e.g. \\boxed{9.8\\ \\mathrm{m/s^2}}.',
].join('\n');

export interface StemEnvironmentOptions {
  /** Where the `python` and `finish` tools come from (default: the built-in tool registry). */
  toolRegistry?: ToolRegistry;
  /** Unit parsing and conversion (default: {@link mathjsUnits}). */
  units?: UnitSystem;
  /** Relative tolerance of numeric answers whose instance gives none (default {@link DEFAULT_RELATIVE_TOLERANCE}). */
  defaultTolerance?: number;
  /**
   * The threads answers are checked on, off the event loop (math/check-pool.ts); a server gives its own and closes it
   * on stop. Default: a process-wide pool. With `units` other than the default, numeric answers are checked inline
   * (a thread has only the default unit system).
   */
  checkPool?: CheckPool;
}

/** The first messages of a question: choices listed as "A) ...", a unit named when the reference has one. */
export function stemPrompt(instance: StemInstance): ChatMessage[] {
  if (instance.kind === 'choice') {
    const options = instance.choices.map((c, i) => `${choiceLetter(i)}) ${c}`).join('\n');
    return [
      { role: 'system', content: STEM_CHOICE_SYSTEM_PROMPT },
      { role: 'user', content: `${instance.question.trim()}\n\n${options}` },
    ];
  }
  const { unitText, percent } = instance.reference;
  const unitHint = unitText !== '' ? `\n\nGive the answer in ${unitText}.` : percent ? '\n\nGive the answer as a percentage.' : '';
  return [
    { role: 'system', content: STEM_NUMERIC_SYSTEM_PROMPT },
    { role: 'user', content: `${instance.question.trim()}${unitHint}` },
  ];
}

/**
 * The "stem" environment: science and engineering questions, multiple choice or numeric with units (see
 * instance.ts for the instance, docs/environments/stem.md for the rules). The model may compute with `python`
 * and answers through `finish`, a \boxed{}, or "The answer is ...". Reward 1 when the answer names the correct
 * choice, or is within the relative tolerance of the reference after unit conversion; else 0. No answer is reward
 * 0 with has_answer 0 (a completed trajectory: the model's failure). The sandbox is only the python tool's.
 *
 * details: { correct, has_answer }; report: { kind, extracted, source, reference, ... } with, for multiple
 * choice, `chosen` and `correct_choice` letters, and for numeric answers `reason`, `converted` (the answer in the
 * reference's unit), `unit` and `tolerance`. Checks run on a checker thread (math/check-pool.ts): one past its CPU
 * bound is reward 0 with `checker_limit`; a checker thread that dies or cannot start is ENVIRONMENT_ERROR.
 *
 * @example
 * const stem = createStemEnvironment();
 * stem.validate({ question: 'g at sea level?', answer: '9.81 m/s^2', tolerance: 0.02 });
 * stem.validate({ question: 'Noble gas?', choices: ['N2', 'Ar', 'O2'], answer: 'B' });
 */
export function createStemEnvironment(options: StemEnvironmentOptions = {}): Environment<StemInstance> {
  const units = options.units ?? mathjsUnits;
  const checkPool = options.checkPool ?? sharedCheckPool();
  return defineEnvironment({
    name: 'stem',
    description:
      'Science and engineering questions: multiple choice {question, choices, answer: letter or text} or numeric {question, answer, tolerance?, unit?} with unit conversion and relative tolerance; python tool; reward 1 if correct.',
    instance: stemInstanceSchema(units, options.defaultTolerance ?? DEFAULT_RELATIVE_TOLERANCE),
    prompt: stemPrompt,
    tools: STEM_TOOL_NAMES,
    ...(options.toolRegistry && { toolRegistry: options.toolRegistry }),
    async evaluate({ instance, outcome, signal }): Promise<Evaluation> {
      const found = findStemAnswer(outcome);
      const reference = instance.kind === 'choice' ? choiceLetter(instance.correct) : instance.answerText;
      if (!found) {
        return { reward: 0, details: { correct: 0, has_answer: 0 }, report: { kind: instance.kind, extracted: null, source: 'none', reference } };
      }
      const base = { kind: instance.kind, ...reportedAnswer(found.answer, MAX_REPORTED_ANSWER_CHARS), source: found.source, reference };
      const limited = (limit: string): Evaluation => ({ reward: 0, details: { correct: 0, has_answer: 1 }, report: { ...base, checker_limit: limit } });
      if (instance.kind === 'choice') {
        // Rules 1 and 2 (the letter or the text) are a few anchored patterns; only the equivalence rule goes to a thread.
        const byText = choiceByText(found.answer, instance.choices);
        let chosen: number | undefined;
        if ('plain' in byText) {
          const checked = await checkPool.check({ kind: 'choice', plain: byText.plain, choices: [...instance.choices] }, signal);
          if ('limit' in checked) return limited(checked.limit);
          chosen = checked.result ?? undefined;
        } else {
          chosen = byText.index;
        }
        const correct = chosen === instance.correct ? 1 : 0;
        return {
          reward: correct,
          details: { correct, has_answer: 1 },
          report: { ...base, chosen: chosen === undefined ? null : choiceLetter(chosen), correct_choice: reference },
        };
      }
      // The parsed unit stays here (a thread parses the text again); a custom unit system has no thread: inline.
      const { unit: _parsed, ...numeric } = instance.reference;
      const task = { kind: 'quantity' as const, answer: found.answer, reference: numeric } satisfies CheckTask;
      const checked: CheckOutcome<typeof task> =
        units === mathjsUnits ? await checkPool.check(task, signal) : { result: compareQuantity(found.answer, instance.reference, units) };
      if ('limit' in checked) return limited(checked.limit);
      const verdict = checked.result;
      const correct = verdict.correct ? 1 : 0;
      return {
        reward: correct,
        details: { correct, has_answer: 1 },
        report: {
          ...base,
          reason: verdict.reason,
          converted: verdict.converted ?? null,
          unit: instance.reference.unitText,
          tolerance: instance.reference.tolerance,
        },
      };
    },
  });
}
