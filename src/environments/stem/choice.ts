import { answersEquivalent } from '../math/equivalence.js';
import { extractLastBoxed, finalReply } from '../math/extract.js';
import type { EpisodeOutcome } from '../types.js';

/**
 * Multiple-choice answers: the choices are labelled A, B, C, ... in order, and a model may answer with the
 * letter in any of the usual dresses ("B", "(B)", "**B**", "B)", "B. 42 J", "The answer is (B).") or with the
 * choice's text ("42 J", or an equivalent number such as "0.5" for "1/2").
 */

/** Longest answer text looked at. */
const MAX_ANSWER_TEXT = 2000;

/** The letter of choice `index` (0 → "A"). */
export function choiceLetter(index: number): string {
  return String.fromCharCode(65 + index);
}

/** Choice text as compared: no markdown emphasis, TeX delimiters or \text{}, case, outer spaces or final period. */
export function normalizeChoiceText(text: string): string {
  return text
    .replace(/\\text(?:bf|rm|it)?\s*\{([^{}]*)\}/g, '$1')
    .replace(/[*_`$]/g, '')
    .replace(/\s+/g, ' ')
    .trim()
    .replace(/^["'“‘]|["'”’]$/g, '')
    .replace(/[.;,]$/, '')
    .trim()
    .toLowerCase();
}

/** "I" followed by a verb a reply goes on with: the pronoun. */
const PRONOUN_I =
  /^I\s+(?:think|believe|guess|would|will|am|choose|chose|pick|picked|select|selected|go|say|feel|suspect|conclude|agree|reckon|know|can|cannot|should|must|need|see|get|found|calculated|computed|have)\b/;

/** The choice a letter names at the start of `text`, with what follows it; undefined when it does not start with one. */
function leadingLetter(text: string, count: number): { index: number; rest: string } | undefined {
  const alone = /^\(?\s*([A-Za-z])\s*\)?$/.exec(text);
  // Lower case only alone or in brackets ("b", "(b)"): "a cat" is an article, not choice A.
  const led = alone ?? /^(?:\(([A-Za-z])\)|\[([A-Za-z])\]|([A-Z])(?=$|[\s.,:;)\]]))[.):\]]?\s*(.*)$/s.exec(text);
  if (!led) return undefined;
  // "I think B", "I would pick C": the pronoun, not choice I (ten-option sets such as MMLU-Pro's reach J).
  if (led[3] === 'I' && PRONOUN_I.test(text)) return undefined;
  const letter = alone ? alone[1]! : (led[1] ?? led[2] ?? led[3])!;
  const index = letter.toUpperCase().charCodeAt(0) - 65;
  if (index < 0 || index >= count) return undefined;
  return { index, rest: alone ? '' : (led[4] ?? '') };
}

/** TeX wrappers a letter or a choice's text is written in: \text{B}, \textbf{(B)}, \mathrm{B}, \boxed{B}. */
const TEXT_COMMAND = /\\(?:text(?:bf|rm|it|sf|tt|normal)?|math(?:rm|bf|it|sf|tt|normal)|mbox|boxed|fbox)\s*\{([^{}]*)\}/g;

/** `text` with TeX text wrappers replaced by their contents (inner ones first: \boxed{\text{B}} → B). */
function unwrapTextCommands(text: string): string {
  let s = text;
  for (let i = 0; i < 3 && s.includes('\\'); i++) {
    const next = s.replace(TEXT_COMMAND, '$1');
    if (next === s) break;
    s = next;
  }
  return s;
}

/** After a leading letter: a connective (or, and, a comma, a slash, &) and another letter, or only more letters. */
const ALTERNATIVE_LETTER = /^(?:(?:[oO][rR]|[aA][nN][dD])\s+|[,/&;]\s*)(?:\(([A-Za-z])\)|\[([A-Za-z])\]|([A-Z]))(?=$|[\s.,:;)\]/&?])/;
const LETTER_LIST = /^(?:\(?([A-Z])\)?[\s,;/&]*)+$/;

/** Whether `rest` (what follows a leading letter) names a choice other than `index`: the answer lists candidates. */
function namesAnotherLetter(rest: string, index: number, count: number): boolean {
  const other = (letter: string | undefined): boolean => {
    const i = (letter ?? '').toUpperCase().charCodeAt(0) - 65;
    return i >= 0 && i < count && i !== index;
  };
  const alternative = ALTERNATIVE_LETTER.exec(rest);
  if (alternative) return other(alternative[1] ?? alternative[2] ?? alternative[3]);
  if (!LETTER_LIST.test(rest)) return false;
  return [...rest.matchAll(/[A-Z]/g)].some((m) => other(m[0]));
}

/**
 * The index of the choice `answer` names, or undefined when it names none or is ambiguous. In order:
 * 1. the text is exactly one choice's text (normalised; so a choice "A" written out still counts as text);
 * 2. it starts with a letter in range ("B", "(B)", "B) ...", "B. ...", "B because ..."; TeX wrappers such as
 *    \text{B} or \boxed{B} read as their contents); when the text after the letter is exactly another choice's text
 *    the answer contradicts itself, and when it names another letter ("A or B", "A, B", "A B C D") it lists
 *    candidates: either way it names none;
 * 3. it is equivalent to exactly one choice under the math environment's answer equivalence (0.5 ~ 1/2).
 */
export function resolveChoice(answer: string, choices: readonly string[]): number | undefined {
  const byText = choiceByText(answer, choices);
  return 'plain' in byText ? choiceByEquivalence(byText.plain, choices) : byText.index;
}

/**
 * Rules 1 and 2 of {@link resolveChoice} (a few anchored patterns over at most MAX_ANSWER_TEXT characters: cheap):
 * the choice, or `plain` (the answer without its "The answer is" dress) when rule 3 must decide.
 */
export function choiceByText(answer: string, choices: readonly string[]): { index: number | undefined } | { plain: string } {
  if (answer.length > MAX_ANSWER_TEXT) return { index: undefined };
  const plain = unwrapTextCommands(answer.replace(/\*\*|__|`/g, ''))
    .replace(/^\s*(?:the\s+)?(?:final\s+|correct\s+)?(?:answer|option|choice)\s*(?:is\b|:)?\s*:?\s*/i, '')
    .trim();
  const normalized = normalizeChoiceText(plain);
  if (normalized === '') return { index: undefined };
  const texts = choices.map(normalizeChoiceText);
  const exact = texts.flatMap((t, i) => (t === normalized ? [i] : []));
  if (exact.length === 1) return { index: exact[0] };
  const led = leadingLetter(plain.replace(/^\$+|\$+$/g, '').trim(), choices.length);
  if (led) {
    // "A or B", "A, B", "(A) and (C)", "A B C D": candidates, not a choice; rewarding the first taught hedging.
    if (namesAnotherLetter(led.rest, led.index, choices.length)) return { index: undefined };
    const rest = normalizeChoiceText(led.rest);
    const other = texts.findIndex((t, i) => i !== led.index && t === rest && t !== texts[led.index]);
    return { index: rest !== '' && other >= 0 ? undefined : led.index };
  }
  return { plain };
}

/**
 * Rule 3 of {@link resolveChoice}: the one choice `plain` is equivalent to under the math environment's answer
 * equivalence, undefined when none or several. This is the costly part (a hostile answer: tens of ms per choice), so
 * the STEM environment runs it on a checker thread (math/check-pool.ts).
 */
export function choiceByEquivalence(plain: string, choices: readonly string[]): number | undefined {
  const equivalent = choices.flatMap((c, i) => (answersEquivalent(plain, c) ? [i] : []));
  return equivalent.length === 1 ? equivalent[0] : undefined;
}

/** Where the final answer was found. */
export type StemAnswerSource = 'finish_tool' | 'boxed' | 'answer_phrase' | 'short_reply';

/** "The answer is (B)", "Final answer: 42 J", "Answer - B": the answer is the text after the last such phrase. */
const ANSWER_PHRASE = /\banswer\s*(?:is\b|:|=|-)\s*:?\s*/gi;

/**
 * The final answer of an episode: the finish tool's answer; else, in the last assistant message's reply (after its
 * `<think>` reasoning, see math/extract.ts finalReply), the last \boxed{}, else the text after the last "answer is" /
 * "answer:" (cut at the end of its sentence), else the whole reply when it is short (at most 80 characters: "B",
 * "**(C)**", "42 J"). Undefined when none.
 */
export function findStemAnswer(outcome: Pick<EpisodeOutcome, 'messages' | 'finishAnswer'>): { answer: string; source: StemAnswerSource } | undefined {
  const submitted = outcome.finishAnswer?.trim();
  if (submitted) return { answer: submitted, source: 'finish_tool' };
  const last = outcome.messages.findLast((m) => m.role === 'assistant');
  // The reply after the message's reasoning (math/extract.ts finalReply): a draft in <think> is no answer.
  const text = last === undefined ? undefined : finalReply(last.content).slice(-20_000).trim();
  if (!text) return undefined;
  const boxed = extractLastBoxed(text);
  if (boxed) return { answer: boxed, source: 'boxed' };
  let after: number | undefined;
  for (const m of text.matchAll(ANSWER_PHRASE)) after = m.index + m[0].length;
  if (after !== undefined) {
    const phrase = text.slice(after).split('\n', 1)[0]!;
    // End at the sentence: a period followed by a space (not a decimal point or "B." alone at the end).
    const sentence = phrase.replace(/\.\s+.*$/s, '').trim();
    if (sentence !== '') return { answer: sentence, source: 'answer_phrase' };
  }
  return text.length <= 80 ? { answer: text, source: 'short_reply' } : undefined;
}
