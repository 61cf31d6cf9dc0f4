import { RolloutError } from '../errors.js';
import type { LedgerSnapshot } from './ledger.js';

/**
 * Throws `internal` unless a snapshot holds the ledger invariants: equal lengths of ids, mask and logprobs;
 * mask values 0/1; logprob 0 where the mask is 0; turns tiling [0, len) in order; assistant turns exactly the
 * mask-1 tokens; two assistant spans in a row only when the second continues the first's message and the first
 * ended "abort" (and `continuesTurn` only there); policyVersionMin <= policyVersionMax, both bounding every span's
 * versions; totalTokens = prompt + response. A trainer fed a broken record would not fail, it would learn from
 * the wrong tokens, so we fail here instead, loudly.
 */
export function verifyLedgerSnapshot(snapshot: LedgerSnapshot): void {
  const problem = findProblem(snapshot);
  if (problem !== undefined) throw new RolloutError('internal', `token ledger invariant violated: ${problem}`);
}

function findProblem(s: LedgerSnapshot): string | undefined {
  const n = s.responseIds.length;
  if (s.mask.length !== n || s.logprobs.length !== n) {
    return `lengths differ: ids ${n}, mask ${s.mask.length}, logprobs ${s.logprobs.length}`;
  }
  for (let i = 0; i < n; i++) {
    const mask = s.mask[i];
    if (mask !== 0 && mask !== 1) return `mask[${i}] is ${mask}`;
    if (mask === 0 && s.logprobs[i] !== 0) return `logprobs[${i}] is ${s.logprobs[i]} where the mask is 0`;
  }
  let at = 0;
  for (const [k, turn] of s.turns.entries()) {
    if (turn.start !== at || turn.end < turn.start) return `turn ${k} spans [${turn.start}, ${turn.end}), expected start ${at}`;
    const expected = turn.role === 'assistant' ? 1 : 0;
    for (let i = turn.start; i < turn.end; i++) {
      if (s.mask[i] !== expected) return `mask[${i}] is ${s.mask[i]} inside ${turn.role} turn ${k}`;
    }
    const previous = k > 0 ? s.turns[k - 1] : undefined;
    const afterAssistant = turn.role === 'assistant' && previous?.role === 'assistant';
    if (afterAssistant && !(turn.continuesTurn === true && previous.finishReason === 'abort')) {
      return `assistant turn ${k} follows assistant turn ${k - 1} without continuing an aborted one`;
    }
    if (turn.continuesTurn === true && !afterAssistant) return `turn ${k} continues a turn but does not follow an assistant turn`;
    for (const v of [turn.policyVersion, turn.policyVersionStart]) {
      if (v !== undefined && (v < s.policyVersionMin || v > s.policyVersionMax)) return `turn ${k} has policy version ${v} outside [${s.policyVersionMin}, ${s.policyVersionMax}]`;
    }
    at = turn.end;
  }
  if (at !== n) return `turns end at ${at}, the response at ${n}`;
  if (s.policyVersionMin > s.policyVersionMax) return 'policyVersionMin > policyVersionMax';
  if (s.totalTokens !== s.promptIds.length + n) return `totalTokens ${s.totalTokens} != ${s.promptIds.length} + ${n}`;
  return undefined;
}
