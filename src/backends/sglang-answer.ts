import { checkFinishReason, checkSampledTokens, CompletionRejected, isRecord, preview, type CompletionExpectation } from './completion.js';
import type { GenerateResult } from './types.js';

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
 * SGLang's own pairing). `output_ids`, when present, must end with the very same ids: SGLang's detokenizer sends
 * its decode ids there, which can start with a few of the prompt's last tokens (its incremental detokenizing's
 * "surrounding" offset; sgl-project/sglang#10896, #17240) — an answer whose ids are not that suffix is refused
 * rather than one of the lists trusted. A request aborted in SGLang's waiting queue (an abort-mode
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
  }
  return { ...checked, finishReason, text };
}
