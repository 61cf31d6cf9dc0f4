import { clipped } from '../errors.js';

/**
 * `extracted` for an environment's report: the model's answer, or its first `max` characters with "…" and
 * `extracted_chars` (its whole length) when longer - never cut silently, never inside a surrogate pair. The answer is
 * the policy's output: uncapped, a 1 MB answer went into every report, journal record and Watch event.
 */
export function reportedAnswer(answer: string, max: number): { extracted: string; extracted_chars?: number } {
  return answer.length <= max ? { extracted: answer } : { extracted: clipped(answer, max, '…'), extracted_chars: answer.length };
}
