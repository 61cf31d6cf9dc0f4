import { checkAnswerId, checkFinishReason, checkPromptCount, checkSampledTokens, checkTokenCount, CompletionRejected, isRecord, preview, type CompletionExpectation } from './completion.js';
import type { GenerateResult } from './types.js';

/**
 * How many of the prompt's last ids SGLang's `output_ids` may start with: its detokenizer decodes from up to
 * INIT_INCREMENTAL_DETOKENIZATION_OFFSET (5) ids before the first sampled one (schedule_batch.py), and sends those
 * decode ids as `output_ids` (sgl-project/sglang#10896, #17240).
 */
export const MAX_SURROUNDING_IDS = 5;

/**
 * The check of a parsed SGLang `/generate` answer (one prompt, `return_logprob: true`, not streamed) before it
 * can become part of a trajectory — the same rules as vLLM's ({@link checkSampledTokens}), read from SGLang's
 * shape:
 *
 * ```
 * { text, output_ids, meta_info: { id, finish_reason: { type: 'stop'|'length'|'abort', matched?|length?|message? },
 *   prompt_tokens, completion_tokens, output_token_logprobs: [[logprob, token_id, text|null], ...], ... } }
 * ```
 *
 * The sampled ids and their logprobs come from `meta_info.output_token_logprobs` (one entry per sampled token,
 * SGLang's own pairing), which must cover every sampled id. `output_ids`, when present, must be the very same ids,
 * preceded by at most {@link MAX_SURROUNDING_IDS} ids that are the prompt's last ones: SGLang's detokenizer sends its
 * decode ids there, which can start with a few of the prompt's tokens (its incremental detokenizing's "surrounding"
 * offset; sgl-project/sglang#10896, #17240). Anything else — ids that are not that suffix, a longer prefix, a prefix
 * that is not the prompt's tail (a logprob list that lost its first entries) — is refused rather than one of the
 * lists trusted; so is a `meta_info.completion_tokens` other than the number of pairs, an answer meant for another
 * request (a `meta_info.id` other than the rid sent, see {@link checkAnswerId}; a `meta_info.prompt_tokens` other than
 * the prompt's length when it brings tokens, see {@link checkPromptCount}), and no pair at all unless
 * the answer is an abort (see {@link checkTokenCount}). A request aborted in SGLang's waiting queue (an abort-mode
 * pause_generation or abort_request before its prefill: "Abort before prefill") answers without either list; that
 * is an abort with no tokens, as the agent loop expects of an abort before the first token. `finish_reason` is an
 * object whose `type` is the reason; a null one (an unfinished answer) is refused. A batch answer (a JSON array) is
 * refused: the client sends one prompt. Throws {@link CompletionRejected} naming the first violation.
 */
export function checkSglangGenerate(json: unknown, expect: CompletionExpectation): GenerateResult {
  if (Array.isArray(json)) throw new CompletionRejected('a batch answer (JSON array) to a single-prompt request');
  if (!isRecord(json)) throw new CompletionRejected('body is not a JSON object');
  const meta = json.meta_info;
  if (!isRecord(meta)) throw new CompletionRejected('meta_info missing');
  // Before anything is read from it: an answer meant for another request (its rid) is refused, whatever it holds.
  checkAnswerId(expect, meta.id, 'meta_info.id', 'rid');

  const pairs = meta.output_token_logprobs;
  const finish = meta.finish_reason;
  if (!isRecord(finish)) throw new CompletionRejected(`meta_info.finish_reason is ${preview(finish)}, not an object (unfinished answer?)`);
  const finishReason = checkFinishReason(finish.type);
  const text = json.text;
  if (typeof text !== 'string') throw new CompletionRejected(`text is ${preview(text)}, not a string`);
  const outputIds = json.output_ids;
  if (outputIds !== undefined && outputIds !== null && !Array.isArray(outputIds)) throw new CompletionRejected(`output_ids is ${preview(outputIds)}, not an array`);

  if ((pairs === undefined || pairs === null) && finishReason === 'abort' && text === '' && (outputIds ?? []).length === 0 && (meta.completion_tokens ?? 0) === 0) {
    return { tokenIds: [], logprobs: [], finishReason, text };
  }
  if (!Array.isArray(pairs)) throw new CompletionRejected('meta_info.output_token_logprobs missing (return_logprob: true needed)');
  if (pairs.length > expect.maxTokens) throw new CompletionRejected(`${pairs.length} token ids for max_tokens ${expect.maxTokens}`);
  const ids = new Array<unknown>(pairs.length);
  const logprobs = new Array<unknown>(pairs.length);
  for (let i = 0; i < pairs.length; i++) {
    const pair: unknown = pairs[i];
    if (!Array.isArray(pair) || pair.length < 2) throw new CompletionRejected(`output_token_logprobs[${i}] is ${preview(pair)}, not [logprob, token_id, text]`);
    logprobs[i] = pair[0];
    ids[i] = pair[1];
  }
  const checked = checkSampledTokens(ids, logprobs, expect, {
    ids: (i) => `output_token_logprobs[${i}][1]`,
    logprobs: (i) => `output_token_logprobs[${i}][0]`,
  });

  if (Array.isArray(outputIds)) {
    const offset = outputIds.length - checked.tokenIds.length;
    const suffix = offset >= 0 && checked.tokenIds.every((id, i) => outputIds[offset + i] === id);
    if (!suffix) throw new CompletionRejected('output_ids do not end with the ids in meta_info.output_token_logprobs');
    if (offset > 0) checkSurrounding(outputIds.slice(0, offset), checked.tokenIds.length, expect);
  }
  checkTokenCount(checked.tokenIds.length, finishReason, expect, meta.completion_tokens, 'meta_info.completion_tokens');
  checkPromptCount(checked.tokenIds.length, expect, meta.prompt_tokens, 'meta_info.prompt_tokens');
  return { ...checked, finishReason, text };
}

/**
 * The ids `output_ids` holds before the sampled ones: at most {@link MAX_SURROUNDING_IDS}, and the prompt's last ids.
 * Anything else is sampled ids output_token_logprobs does not cover.
 */
function checkSurrounding(prefix: readonly unknown[], sampled: number, expect: CompletionExpectation): void {
  const prompt = expect.promptIds;
  const uncovered = `output_ids hold ${prefix.length} ids before the ${sampled} of meta_info.output_token_logprobs`;
  if (prefix.length > MAX_SURROUNDING_IDS) throw new CompletionRejected(`${uncovered} (at most ${MAX_SURROUNDING_IDS} of the prompt's last ids may precede them)`);
  const start = prompt === undefined ? -1 : prompt.length - prefix.length;
  if (prompt === undefined || start < 0 || prefix.some((id, i) => id !== prompt[start + i])) {
    throw new CompletionRejected(`${uncovered}, and they are not the prompt's last ids: sampled ids without logprobs`);
  }
}
