import { z } from 'zod';
import { RolloutError } from '../../errors.js';
import { MAX_ANSWER_LENGTH } from './equivalence.js';

/** Longest problem statement accepted; the task's byte budget usually binds first. */
export const MAX_PROBLEM_LENGTH = 100_000;

const nonEmptyString = (max: number) =>
  z
    .string({ error: 'must be a string' })
    .trim()
    .min(1, { error: 'must not be empty' })
    .max(max, { error: `must be at most ${max} characters` });

/**
 * The instance of the math environment. Unknown extra fields are accepted and dropped: dataset rows usually
 * carry columns such as id, level or subject, and making trainers strip them first would only add friction.
 * `answer` may be a JSON number (datasets store integers as numbers) or a string (LaTeX, fractions, tuples).
 */
/** The answer checkers: the built-in TypeScript one, or math-verify run in the sandbox (math-verify-checker.ts). */
export const MATH_CHECKERS = ['builtin', 'math-verify'] as const;
export type MathChecker = (typeof MATH_CHECKERS)[number];

export const mathInstanceSchema = z.object({
  problem: nonEmptyString(MAX_PROBLEM_LENGTH),
  answer: z.union([nonEmptyString(MAX_ANSWER_LENGTH), z.number({ error: 'must be a finite number' })], {
    error: 'must be a non-empty string or a finite number',
  }),
  /** Which checker grades this instance; default the environment's (`builtin` unless the server says otherwise). */
  checker: z.enum(MATH_CHECKERS, { error: `must be one of ${MATH_CHECKERS.join(', ')}` }).optional(),
});

export type MathInstance = z.output<typeof mathInstanceSchema>;

/** JSON Schema of the instance (draft 2020-12), as ListEnvironments reports it. */
export const mathInstanceJsonSchema: Record<string, unknown> = {
  ...z.toJSONSchema(mathInstanceSchema, { io: 'input' }),
  additionalProperties: true,
  description: 'A math problem and its reference answer. Extra fields are allowed and ignored.',
};

/**
 * Validates an instance. Throws RolloutError.invalid('instance.problem' | 'instance.answer' | 'instance',
 * reason) for the first problem found, so the trainer sees which field of which task is wrong.
 */
export function validateMathInstance(instance: unknown): MathInstance {
  const result = mathInstanceSchema.safeParse(instance);
  if (result.success) return result.data;
  const issue = result.error.issues[0];
  const path = issue?.path.map(String).join('.') ?? '';
  const field = path === '' ? 'instance' : `instance.${path}`;
  if (path === '') throw RolloutError.invalid(field, 'must be an object with "problem" and "answer"');
  const key = issue?.path[0];
  if (typeof key === 'string' && (instance as Record<string, unknown>)[key] === undefined) throw RolloutError.invalid(field, 'required');
  throw RolloutError.invalid(field, issue?.message ?? 'invalid');
}
