import { z } from 'zod';
import { MAX_ANSWER_LENGTH } from './equivalence.js';

/** Longest problem statement accepted; the task's byte budget usually binds first. */
export const MAX_PROBLEM_LENGTH = 100_000;

const nonEmptyString = (max: number) =>
  z
    .string({ error: 'must be a string' })
    .trim()
    .min(1, { error: 'must not be empty' })
    .max(max, { error: `must be at most ${max} characters` });

/** The answer checkers: the built-in TypeScript one, or math-verify run in a fresh sandbox (math-verify-checker.ts). */
export const MATH_CHECKERS = ['builtin', 'math-verify'] as const;
export type MathChecker = (typeof MATH_CHECKERS)[number];

/**
 * The instance of the math environment. Unknown extra fields are accepted and dropped: dataset rows usually
 * carry columns such as id, level or subject, and making trainers strip them first would only add friction.
 * `answer` may be a JSON number (datasets store integers as numbers) or a string (LaTeX, fractions, tuples).
 * Strings are trimmed. ListEnvironments shows it as JSON Schema (defineEnvironment derives it from this schema).
 */
export const mathInstanceSchema = z
  .object({
    problem: nonEmptyString(MAX_PROBLEM_LENGTH).describe('The problem, as shown to the model.'),
    answer: z
      .union([nonEmptyString(MAX_ANSWER_LENGTH), z.number({ error: 'must be a finite number' })], {
        error: 'must be a non-empty string or a finite number',
      })
      .describe('The reference answer: LaTeX or plain text, or a number.'),
    checker: z
      .enum(MATH_CHECKERS, { error: `must be one of ${MATH_CHECKERS.join(', ')}` })
      .optional()
      .describe("Which checker grades this instance; default the server's (builtin unless `serve --math-checker` says otherwise)."),
  })
  .describe('A math problem and its reference answer. Extra fields are allowed and ignored.');

export type MathInstance = z.output<typeof mathInstanceSchema>;
