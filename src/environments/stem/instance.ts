import { z } from 'zod';
import { choiceLetter, resolveChoice } from './choice.js';
import { parseQuantity, type NumericReference } from './quantity.js';
import { mathjsUnits, type UnitSystem } from './units.js';

/** Relative tolerance of numeric answers when the instance gives none: 1%, what textbook answers round to. */
export const DEFAULT_RELATIVE_TOLERANCE = 0.01;
/** Longest question accepted, characters. */
export const MAX_QUESTION_LENGTH = 100_000;
const MAX_CHOICE_LENGTH = 10_000;

/** A multiple-choice question, normalised: the correct choice by index. */
export interface ChoiceQuestion {
  kind: 'choice';
  question: string;
  choices: string[];
  correct: number;
}

/** A numeric question, normalised: the reference value in its unit and the tolerance. */
export interface NumericQuestion {
  kind: 'numeric';
  question: string;
  reference: NumericReference;
  /** The reference as given (for the report). */
  answerText: string;
}

export type StemInstance = ChoiceQuestion | NumericQuestion;

const nonEmpty = (max: number) =>
  z
    .string()
    .max(max, { error: `must be at most ${max} characters` })
    .refine((s) => s.trim() !== '', { error: 'must not be empty' });

/**
 * The STEM instance schema: {question, choices?, answer, tolerance?, unit?}. With `choices` it is multiple
 * choice and `answer` is a letter (A = the first choice) or one choice's text; without, `answer` is a number or a
 * numeric string, optionally with its unit ("9.8 m/s^2", "3.2e5", "1,200", "45%"), `unit` the unit the reference
 * is in (when the answer string has another compatible one, it is converted) and `tolerance` the relative
 * tolerance (default {@link DEFAULT_RELATIVE_TOLERANCE}). Unknown extra fields are accepted and dropped.
 */
export function stemInstanceSchema(units: UnitSystem = mathjsUnits, defaultTolerance = DEFAULT_RELATIVE_TOLERANCE) {
  return z
    .object({
      question: nonEmpty(MAX_QUESTION_LENGTH).describe('The question, as shown to the model.'),
      choices: z
        .array(nonEmpty(MAX_CHOICE_LENGTH))
        .min(2, { error: 'must hold at least 2 choices' })
        .max(26, { error: 'must hold at most 26 choices (A–Z)' })
        .optional()
        .describe('Multiple choice: the options, labelled A, B, C, ... in this order.'),
      answer: z
        .union([nonEmpty(1000), z.number()], { error: 'must be a non-empty string or a finite number' })
        .describe('Multiple choice: the letter or the choice text. Numeric: the value, optionally with its unit.'),
      tolerance: z.number().min(0).max(1, { error: 'is relative: at most 1' }).optional().describe(`Relative tolerance of numeric answers (default ${defaultTolerance}).`),
      unit: z.string().max(100).optional().describe('Unit of the numeric reference (e.g. "m/s", "kJ/mol", "%"); answers in compatible units are converted.'),
    })
    .transform((row, ctx): StemInstance => {
      if (row.choices) {
        const correct = resolveChoice(String(row.answer), row.choices);
        if (correct === undefined) {
          ctx.issues.push({ code: 'custom', path: ['answer'], input: row.answer, message: `must be a choice letter (A–${choiceLetter(row.choices.length - 1)}) or the text of one choice` });
          return z.NEVER;
        }
        return { kind: 'choice', question: row.question, choices: row.choices, correct };
      }
      const parsed = typeof row.answer === 'number' ? { value: row.answer, percent: false, unitText: '' } : parseQuantity(row.answer);
      if (!parsed || !Number.isFinite(parsed.value)) {
        ctx.issues.push({ code: 'custom', path: ['answer'], input: row.answer, message: 'must be a number (optionally with a unit) when there are no choices' });
        return z.NEVER;
      }
      let { value, percent } = parsed;
      let unitText = (row.unit ?? parsed.unitText).trim();
      if (unitText === '%') {
        percent = true;
        unitText = '';
      }
      const unit = unitText === '' ? undefined : units.parse(unitText);
      if (row.unit !== undefined && parsed.unitText !== '' && unit) {
        const own = units.parse(parsed.unitText);
        const converted = own && units.convert(value, own, unit);
        if (own && converted === undefined) {
          ctx.issues.push({ code: 'custom', path: ['unit'], input: row.unit, message: `is not compatible with the answer's unit "${parsed.unitText}"` });
          return z.NEVER;
        }
        if (converted !== undefined) value = converted;
      }
      const tolerance = row.tolerance ?? defaultTolerance;
      return { kind: 'numeric', question: row.question, answerText: String(row.answer), reference: { value, percent, unitText, unit, tolerance } };
    });
}
