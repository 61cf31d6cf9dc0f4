import { RolloutError } from '../errors.js';
import { MAX_ENGINE_LIMIT } from './engine-http.js';

/**
 * The engine refused a request because prompt + max_tokens exceed its context (max_model_len). That is the
 * policy running out of room, not the infrastructure failing: the agent loop ends the trajectory TRUNCATED
 * (finish_reason "max_model_len"), and the pool learns the limit from the message. Its code stays backend_error
 * so that, should it ever escape the agent loop, it is still filtered out rather than scored.
 */
export class ContextOverflowError extends RolloutError {
  constructor(
    /** The engine's max_model_len, as its message states it. */
    readonly maxModelLen: number,
    /** Prompt tokens the engine counted, when its message says. */
    readonly promptTokens: number | undefined,
    message: string,
    cause?: unknown,
  ) {
    super('backend_error', message, { cause });
  }
}

/** What an engine's context-length refusal says: its limit and, when it says, the prompt tokens it counted. */
export interface ContextOverflowClaim {
  /** The largest prompt + max_tokens the engine takes (vLLM's meaning of max_model_len). */
  maxModelLen: number;
  /** The prompt tokens the engine counted, when its message says. */
  promptTokens: number | undefined;
  /**
   * Set when the refusal is of the prompt alone, whatever max_tokens (SGLang's scheduler): the most prompt tokens the
   * engine takes. Otherwise the refusal is of prompt + max_tokens over {@link maxModelLen}.
   */
  inputLimit?: number;
}

/**
 * Why a refusal cannot be the answer to a request of `promptTokens` + `maxTokens` (undefined when it can): an engine
 * refuses only a request over its limit, and counts the prompt's ids as sent. Anything else is another request's
 * refusal or a canned error; taken as a context overflow it would end the trajectory TRUNCATED (a policy outcome) and
 * teach the pool a limit the engine does not have.
 */
export function overflowMismatch(claim: ContextOverflowClaim, promptTokens: number, maxTokens: number): string | undefined {
  if (claim.promptTokens !== undefined && claim.promptTokens !== promptTokens) {
    return `it counted ${claim.promptTokens} prompt tokens, and the request has ${promptTokens}`;
  }
  if (claim.inputLimit !== undefined) {
    return promptTokens > claim.inputLimit ? undefined : `the request's ${promptTokens} prompt tokens fit its stated input limit ${claim.inputLimit}`;
  }
  if (promptTokens + maxTokens > claim.maxModelLen) return undefined;
  return `the request's ${promptTokens} prompt tokens + ${maxTokens} max_tokens fit its stated limit ${claim.maxModelLen}`;
}

const LIMIT = /maximum context length is (\d+) tokens/;
const PROMPT = [/\((\d+) in the messages/, /request has (\d+) input tokens/, /requested (\d+) tokens in the messages/, /prompt contains (\d+) input tokens/];
/** vLLM >= 0.3x clamps max_tokens to the room left; a prompt of exactly max_model_len leaves none. */
const NO_ROOM = /max_tokens must be at least 1, got 0\b/;

/**
 * Recognises vLLM's context-length refusal, narrowly: HTTP 400 whose JSON error message (`error.message` in
 * vLLM >= 0.10, top-level `message` before) says "maximum context length is N tokens". Both phrasings vLLM uses
 * are understood: "However, you requested M tokens (P in the messages, C in the completion)" and "'max_tokens'
 * ... is too large: C. This model's maximum context length is N tokens and your request has P input tokens", and
 * vLLM 0.32's "However, your prompt contains P input tokens, which exceeds this limit even without any output tokens".
 *
 * vLLM 0.32 no longer refuses prompt + max_tokens > max_model_len (it shortens max_tokens to the room left), and a
 * prompt of exactly max_model_len then gets "max_tokens must be at least 1, got 0", which names no limit: given the
 * request's `promptTokens`, that answer is recognised too, the limit being the prompt's length.
 */
export function parseContextOverflow(status: number, body: string, promptTokens?: number): ContextOverflowClaim | undefined {
  if (status !== 400) return undefined;
  if (promptTokens !== undefined && promptTokens > 0 && NO_ROOM.test(body)) return { maxModelLen: promptTokens, promptTokens };
  if (!body.includes('maximum context length')) return undefined;
  const message = errorMessage(body);
  if (message === undefined) return undefined;
  const limit = LIMIT.exec(message);
  if (!limit) return undefined;
  const maxModelLen = Number(limit[1]);
  if (!Number.isSafeInteger(maxModelLen) || maxModelLen <= 0 || maxModelLen > MAX_ENGINE_LIMIT) return undefined;
  const prompt = PROMPT.map((re) => re.exec(message)).find((m) => m !== null);
  return { maxModelLen, promptTokens: prompt ? Number(prompt[1]) : undefined };
}

const SGLANG_INPUT = /The input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)/;
const SGLANG_TOTAL = /Requested token count exceeds the model's maximum context length of (\d+) tokens\. You requested a total of \d+ tokens: (\d+) tokens from the input/;
const SGLANG_SCHEDULER = /Input length \((\d+) tokens\) exceeds the maximum allowed length \((\d+) tokens\)/;

/**
 * Recognises SGLang's context-length refusal (tokenizer_manager's request validation, answered by /generate as
 * HTTP 400 `{"error": {"message": ...}}`), narrowly, in its two phrasings:
 * "The input (P tokens) is longer than the model's context length (N tokens)." and "Requested token count exceeds
 * the model's maximum context length of N tokens. You requested a total of T tokens: P tokens from the input
 * messages and C tokens for the completion. ...".
 *
 * SGLang refuses prompt + max_new_tokens >= N, where vLLM refuses only > N: the limit returned is N - 1, the
 * largest prompt + max_tokens SGLang accepts, so the rest of the server keeps vLLM's `<=` meaning of max_model_len.
 *
 * Also its scheduler's refusal of a prompt its token pool cannot take (SGLang v0.5.6 `managers/utils.py`
 * validate_input_length: "Input length (P tokens) exceeds the maximum allowed length (L tokens)", L being
 * max_req_len - 5 where max_req_len = min(context_len, max_total_num_tokens) - 1): the limit returned is L + 5.
 */
export function parseSglangContextOverflow(status: number, body: string): ContextOverflowClaim | undefined {
  if (status !== 400 || !(body.includes('context length') || body.includes('maximum allowed length'))) return undefined;
  const message = errorMessage(body);
  if (message === undefined) return undefined;
  const scheduler = SGLANG_SCHEDULER.exec(message);
  if (scheduler) {
    // max_req_input_len is max_req_len - 5, and max_req_len (min(context_len, max_total_num_tokens) - 1) is the limit.
    const inputLimit = Number(scheduler[2]);
    const promptTokens = Number(scheduler[1]);
    if (!Number.isSafeInteger(inputLimit) || inputLimit < 1 || inputLimit + 5 > MAX_ENGINE_LIMIT) return undefined;
    return { maxModelLen: inputLimit + 5, promptTokens: Number.isSafeInteger(promptTokens) ? promptTokens : undefined, inputLimit };
  }
  const input = SGLANG_INPUT.exec(message);
  const total = input ? undefined : SGLANG_TOTAL.exec(message);
  const contextLen = Number(input ? input[2] : total?.[1]);
  const promptTokens = Number(input ? input[1] : total?.[2]);
  if (!Number.isSafeInteger(contextLen) || contextLen <= 1 || contextLen - 1 > MAX_ENGINE_LIMIT) return undefined;
  return { maxModelLen: contextLen - 1, promptTokens: Number.isSafeInteger(promptTokens) ? promptTokens : undefined };
}

/** The message of an engine's JSON error body: `{"error": {"message"}}` (both engines) or `{"message"}` (vLLM's flat shape). */
function errorMessage(body: string): string | undefined {
  try {
    const json = JSON.parse(body) as { message?: unknown; error?: { message?: unknown } } | null;
    const message = json?.error?.message ?? json?.message;
    return typeof message === 'string' ? message : undefined;
  } catch {
    return undefined;
  }
}
