import { choiceByEquivalence } from '../stem/choice.js';
import { compareQuantity, type NumericReference, type NumericVerdict } from '../stem/quantity.js';
import { mathjsUnits, type Unit } from '../stem/units.js';
import { checkEquivalence, MAX_ANSWER_LENGTH, type EquivalenceResult } from './equivalence.js';

/**
 * The built-in answer checks that run on a checker thread (check-pool.ts), as data that crosses a thread boundary
 * (structured clone): the math environment's equivalence, STEM's numeric comparison with units, and STEM's "which
 * choice is this answer equivalent to". {@link runCheckTask} is what the thread runs, and what a direct call gives:
 * the verdicts are the same functions', so running a check on a thread never changes a reward.
 */
export type CheckTask =
  | { kind: 'equivalence'; predicted: string; reference: string }
  /** A numeric STEM answer against its reference, with the default unit system (mathjs); the reference's unit is parsed again from its text there. */
  | { kind: 'quantity'; answer: string; reference: Omit<NumericReference, 'unit'> }
  /** STEM multiple choice, rule 3 of resolveChoice: the one choice `plain` is equivalent to (null: none, or several). */
  | { kind: 'choice'; plain: string; choices: string[] };

export type CheckResult<T extends CheckTask = CheckTask> = T extends { kind: 'equivalence' }
  ? EquivalenceResult
  : T extends { kind: 'quantity' }
    ? NumericVerdict
    : number | null;

/** Runs one check where it is called (on a checker thread, or inline). Throws only on a checker bug. */
export function runCheckTask<T extends CheckTask>(task: T): CheckResult<T> {
  switch (task.kind) {
    case 'equivalence':
      return checkEquivalence(task.predicted, task.reference) as CheckResult<T>;
    case 'quantity': {
      const unit = referenceUnit(task.reference.unitText);
      return compareQuantity(task.answer, { ...task.reference, unit }, mathjsUnits) as CheckResult<T>;
    }
    case 'choice':
      return (choiceByEquivalence(task.plain, task.choices) ?? null) as CheckResult<T>;
  }
}

/**
 * The answer of a check whose cost is plainly negligible (a few string operations, no parsing), or undefined when it
 * must go to a thread. Measured: a normal equivalence check costs 10–250 µs of the event loop inline, ~25 µs through a
 * thread (0.1–0.3 ms later), a hostile one 50–360 ms inline; only checks answered without parsing stay here, so no
 * answer can make the inline path cost more than a pass over its characters.
 */
export function inlineCheck<T extends CheckTask>(task: T): CheckResult<T> | undefined {
  if (task.kind !== 'equivalence') return undefined;
  const a = task.predicted.trim();
  const b = task.reference.trim();
  // The first three cases of checkEquivalence, answered as it answers them (an identical pair normalises to the same
  // text, which is "text" unless it normalises to nothing: that one goes to the thread).
  if (a === '' || b === '') return { equivalent: false, method: 'none' } as CheckResult<T>;
  if (a.length > MAX_ANSWER_LENGTH || b.length > MAX_ANSWER_LENGTH) return { equivalent: a === b, method: 'text' } as CheckResult<T>;
  if (a === b && /^[0-9a-zA-Z.+\-/]+$/.test(a)) return { equivalent: true, method: 'text' } as CheckResult<T>;
  return undefined;
}

/** Parsed reference units of this thread, by text: a STEM dataset has few, and mathjs's parse is not free. */
const referenceUnits = new Map<string, Unit | undefined>();
const MAX_REFERENCE_UNITS = 1024;

function referenceUnit(text: string): Unit | undefined {
  if (text === '') return undefined;
  if (referenceUnits.has(text)) return referenceUnits.get(text);
  const unit = mathjsUnits.parse(text);
  if (referenceUnits.size >= MAX_REFERENCE_UNITS) referenceUnits.clear();
  referenceUnits.set(text, unit);
  return unit;
}
