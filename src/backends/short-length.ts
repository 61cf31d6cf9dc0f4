import { RolloutError, throwIfAborted } from '../errors.js';
import type { Logger } from '../observability/logger.js';
import type { BackendState } from './backend-state.js';
import type { GenerateRequest, GenerateResult } from './types.js';

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

/** What {@link checkShortLength} needs of its pool. */
export interface ShortLengthHost {
  readonly log: Logger;
  /** Asks the engine its limits now (BackendPool.learn; shared with attempts under way; never throws). */
  relearn(backend: BackendState): Promise<void>;
}

/**
 * An answer that ended "length" with fewer tokens than its max_tokens: the engine stopped at the end of its context
 * (vLLM >= 0.3x shortens max_tokens to the room left instead of refusing, SGLang's scheduler too), which the agent
 * loop reads as the trajectory running out of context (TRUNCATED, max_model_len). That holds when prompt + sampled
 * reach the limit the pool knows for the engine, and when the pool knows none (nothing contradicts the cut; see
 * {@link shortLengthProblem}). Otherwise the engine's limit is not the one the pool knows — it was restarted with a
 * smaller --max-model-len — so the engine is asked again (the pool re-learns it: the next turns are sized to it);
 * an engine that still states a limit far from reached contradicts its own answer, which is refused as backend_error
 * (a malformed answer is infrastructure, never a budget the policy used up). A configured limit is not asked: an
 * answer far from it is refused the same way.
 */
export async function checkShortLength(host: ShortLengthHost, backend: BackendState, request: GenerateRequest, result: GenerateResult): Promise<void> {
  const shape = { promptTokens: request.promptIds.length, sampled: result.tokenIds.length, maxTokens: request.maxTokens };
  if (shortLengthProblem(shape, backend.maxModelLen) === undefined) return;
  if (backend.client.modelInfo !== undefined && !backend.maxModelLenConfigured && !backend.removed) {
    const before = backend.maxModelLen;
    backend.modelInfoStale = true;
    const relearn = (async () => {
      await host.relearn(backend);
      // The attempt this shared may have been asked before the answer came: then once more.
      if (backend.modelInfoStale && !backend.removed) await host.relearn(backend);
    })();
    // Bounded by modelInfoTimeoutMs per attempt; the caller's cancel or deadline does not wait for it.
    await untilAborted(relearn, request.signal);
    host.log.warn({ backend: backend.id, ...shape, previous: before, maxModelLen: backend.maxModelLen }, 'engine cut an answer short of max_tokens below its known max_model_len: limit asked again');
  }
  const problem = shortLengthProblem(shape, backend.maxModelLen);
  if (problem !== undefined) throw new RolloutError('backend_error', `engine ${backend.client.url} answered ${problem}`);
}

/** Waits for `work`, or rejects with the signal's reason (a RolloutError) as soon as it fires; `work` goes on either way. */
function untilAborted(work: Promise<void>, signal: AbortSignal): Promise<void> {
  throwIfAborted(signal);
  return new Promise<void>((resolve, reject) => {
    const onAbort = (): void => reject(RolloutError.from(signal.reason, 'cancelled'));
    signal.addEventListener('abort', onAbort, { once: true });
    void work.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
