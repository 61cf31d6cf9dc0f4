/**
 * How far short of an engine's known max_model_len an answer cut by the engine may end and still be read as the
 * context's end. vLLM ends at prompt + sampled = max_model_len exactly (it shortens max_tokens to the room left, or
 * stops once the sequence fills the context); SGLang's limit is strict (prompt + max_new_tokens < context_len, the
 * client reports context_len - 1) and its scheduler shortens max_new_tokens by one more, so it ends a token or two
 * before. A few tokens of slack take those off-by-ones; an answer far from the limit is not a full context.
 */
export const CONTEXT_END_SLACK_TOKENS = 8;

/** One answer that ended "length": its request's prompt and max_tokens, and how many tokens it sampled. */
export interface ShortLengthAnswer {
  promptTokens: number;
  sampled: number;
  maxTokens: number;
}

/**
 * Why an answer that ended "length" cannot be the engine's cut at the end of its context, or undefined when it can
 * be: it sampled its whole max_tokens (the request's own bound, not the context's), the engine's limit is unknown
 * (nothing contradicts it), or prompt + sampled reach `maxModelLen` within {@link CONTEXT_END_SLACK_TOKENS}.
 */
export function shortLengthProblem(answer: ShortLengthAnswer, maxModelLen: number | undefined): string | undefined {
  const { promptTokens, sampled, maxTokens } = answer;
  if (sampled >= maxTokens || maxModelLen === undefined) return undefined;
  const end = promptTokens + sampled;
  if (end >= maxModelLen - CONTEXT_END_SLACK_TOKENS) return undefined;
  return (
    `finish_reason "length" after ${sampled} of ${maxTokens} max_tokens with a ${promptTokens}-token prompt: ` +
    `${end} tokens, far from its max_model_len ${maxModelLen} (neither limit reached)`
  );
}
