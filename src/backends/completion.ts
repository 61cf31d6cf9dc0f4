import type { GenerateResult, TokenIds } from './types.js';

/**
 * Largest logprob accepted. A logprob is log(p) with p <= 1, so it is <= 0; engines compute it in float32
 * (log_softmax), which can leave rounding noise of about 1e-7 above 0 for a token of probability ~1. 1e-4 is far
 * above that noise and far below anything a broken engine plausibly sends (+3.5 is rejected). Values within the
 * tolerance are kept exactly as sent, never clamped: the trajectory carries what the engine said.
 */
export const LOGPROB_TOLERANCE = 1e-4;

/** What the request asked for, against which the answer is checked. */
export interface CompletionExpectation {
  /** max_tokens of the request: an answer with more tokens ignored it. */
  maxTokens: number;
  /** The tokenizer's vocabulary size: every id must be an integer in [0, vocabSize). Unchecked when absent. */
  vocabSize?: number;
  /**
   * The request's prompt: what an answer may echo before its sampled ids (SGLang's detokenizer's "surrounding" ids,
   * see checkSglangGenerate). Absent: no echo is accepted.
   */
  promptIds?: TokenIds;
  /**
   * The id the request was sent with (SGLang's `rid`): an answer that names another id answers another request.
   * Absent: not checked.
   */
  requestId?: string;
}

/** Why an engine answer was refused; the engine client wraps it into a backend_error. */
export class CompletionRejected extends Error {
  constructor(readonly reason: string) {
    super(reason);
    this.name = 'CompletionRejected';
  }
}

/**
 * The answer is well formed but answers another request (it states another prompt length or another request id): a
 * gateway or proxy mixing answers up, or a connection out of step. An engine/transport fault, not a bad sample: the
 * engine client reports it as {@link EngineMisdeliveredError}, which the pool asks again (see BackendPool).
 */
export class AnswerMisdelivered extends CompletionRejected {
  constructor(reason: string) {
    super(reason);
    this.name = 'AnswerMisdelivered';
  }
}

const FINISH_REASONS: ReadonlySet<unknown> = new Set<GenerateResult['finishReason']>(['stop', 'length', 'abort']);

/** How the fields of one engine's answer are named in refusal messages. */
export interface AnswerFieldNames {
  /** The path of the i-th id, e.g. `token_ids[3]`. */
  ids: (i: number) => string;
  logprobs: (i: number) => string;
}

/**
 * The rules every engine answer obeys, whatever its wire shape (vLLM and SGLang clients both end here): at most
 * `maxTokens` ids, each an integer in [0, vocabSize); exactly one logprob per id, finite as a float32 (the trajectory's
 * logprob type) and <= {@link LOGPROB_TOLERANCE}. Copies into fresh arrays of numbers, so nothing else of the engine's JSON lives on.
 * Throws {@link CompletionRejected} naming the first violation with the engine's own field names.
 */
export function checkSampledTokens(
  ids: readonly unknown[],
  rawLogprobs: readonly unknown[],
  expect: CompletionExpectation,
  names: AnswerFieldNames,
): { tokenIds: number[]; logprobs: number[] } {
  if (ids.length > expect.maxTokens) {
    throw new CompletionRejected(`${ids.length} token ids for max_tokens ${expect.maxTokens}`);
  }
  const vocab = expect.vocabSize ?? Number.MAX_SAFE_INTEGER;
  const tokenIds = new Array<number>(ids.length);
  for (let i = 0; i < ids.length; i++) {
    const id: unknown = ids[i];
    if (typeof id !== 'number' || !Number.isInteger(id) || id < 0 || id >= vocab) {
      const range = expect.vocabSize === undefined ? 'a non-negative integer' : `an integer in [0, ${expect.vocabSize})`;
      throw new CompletionRejected(`${names.ids(i)} = ${preview(id)} is not ${range}`);
    }
    tokenIds[i] = id;
  }
  if (rawLogprobs.length !== tokenIds.length) throw new CompletionRejected(`${tokenIds.length} token ids but ${rawLogprobs.length} logprobs`);
  const logprobs = new Array<number>(rawLogprobs.length);
  for (let i = 0; i < rawLogprobs.length; i++) {
    const p: unknown = rawLogprobs[i];
    if (typeof p !== 'number' || !Number.isFinite(p)) throw new CompletionRejected(`${names.logprobs(i)} = ${preview(p)} is not a finite number`);
    if (p > LOGPROB_TOLERANCE) throw new CompletionRejected(`${names.logprobs(i)} = ${p} is positive (a log-probability is <= 0)`);
    // Trajectory.response_logprobs is float32: a double past its range would fail the trajectory's encoding (and lose
    // its tokens as an environment error) long after the answer that caused it. No float32 engine can compute one.
    if (!Number.isFinite(Math.fround(p))) throw new CompletionRejected(`${names.logprobs(i)} = ${p} is beyond float32 (no engine computes such a log-probability)`);
    logprobs[i] = p;
  }
  return { tokenIds, logprobs };
}

/** Narrows a finish reason to stop/length/abort, or throws {@link CompletionRejected}. */
export function checkFinishReason(value: unknown): GenerateResult['finishReason'] {
  if (!FINISH_REASONS.has(value)) throw new CompletionRejected(`unexpected finish_reason ${preview(value)}`);
  return value as GenerateResult['finishReason'];
}

/**
 * The count rules every engine answer obeys besides {@link checkSampledTokens}'s bound: with max_tokens >= 1 every
 * decoding step samples a token — a stop token, or the token completing a stop string, is among the ids — so only an
 * abort (a request ended before its first step) may come back with none; and when the engine states how many tokens
 * it generated (vLLM `usage.completion_tokens`, SGLang `meta_info.completion_tokens`), the ids are exactly that many:
 * an answer whose lists lost entries would otherwise drop sampled tokens from the trajectory without a trace (the next
 * turn's context then lacks them too). `stated` is the engine's count as sent (undefined or null: not stated).
 */
export function checkTokenCount(count: number, finishReason: GenerateResult['finishReason'], expect: CompletionExpectation, stated: unknown, statedName: string): void {
  if (count === 0 && finishReason !== 'abort' && expect.maxTokens > 0) {
    throw new CompletionRejected(`no sampled token with finish_reason "${finishReason}" (every step samples one; only an abort may end with none)`);
  }
  if (stated === undefined || stated === null) return;
  if (stated !== count) throw new CompletionRejected(`${statedName} = ${preview(stated)}, but the answer holds ${count} sampled token ids`);
}

/**
 * The one check of a parsed vLLM `/v1/completions` answer before it can become part of a trajectory: every
 * field the rollout uses is typed and bounded, and only those fields are copied out.
 *
 * The sampled ids come from `choices[0].token_ids` when the answer has them (`return_token_ids: true`), otherwise
 * from `logprobs.tokens`, where `return_tokens_as_token_ids: true` makes vLLM write each sampled token as
 * `"token_id:<id>"` (what {@link VllmClient} asks for: `return_token_ids` would also echo every prompt id, 400 KB of
 * JSON to parse per turn at 64K tokens). Either way they are the engine's ids verbatim, never re-derived from text.
 *
 * Checked: `choices[0]` exists; the ids and `logprobs.token_logprobs` by {@link checkSampledTokens} (a token that is
 * not `"token_id:<decimal>"` is refused; with both `token_ids` and `logprobs.tokens`, they name the same ids);
 * `finish_reason` is stop/length/abort; `text` is a string; the count by {@link checkTokenCount} (no id only for an
 * abort; exactly `usage.completion_tokens` of them when stated); `usage.prompt_tokens`, when stated, by
 * {@link checkPromptCount}. Throws {@link CompletionRejected} naming the first violation.
 */
export function checkCompletion(json: unknown, expect: CompletionExpectation): GenerateResult {
  if (!isRecord(json)) throw new CompletionRejected('body is not a JSON object');
  const choices = json.choices;
  if (!Array.isArray(choices) || choices.length === 0) throw new CompletionRejected('no choices[0]');
  const choice: unknown = choices[0];
  if (!isRecord(choice)) throw new CompletionRejected('choices[0] is not an object');

  const logprobsField = choice.logprobs;
  const raw = isRecord(logprobsField) ? logprobsField.token_logprobs : undefined;
  const tokens = isRecord(logprobsField) ? logprobsField.tokens : undefined;
  const echoed = choice.token_ids;
  let ids: readonly unknown[];
  let idName: (i: number) => string;
  if (Array.isArray(echoed)) {
    ids = echoed;
    idName = (i) => `token_ids[${i}]`;
  } else {
    if (!Array.isArray(tokens)) {
      throw new CompletionRejected('neither choices[0].token_ids nor choices[0].logprobs.tokens (vLLM with return_tokens_as_token_ids needed)');
    }
    ids = tokenIdsOfTokens(tokens, expect.maxTokens);
    idName = (i) => `logprobs.tokens[${i}] (token_id)`;
  }
  if (ids.length > expect.maxTokens) throw new CompletionRejected(`${ids.length} token ids for max_tokens ${expect.maxTokens}`);
  if (!Array.isArray(raw)) throw new CompletionRejected('choices[0].logprobs.token_logprobs missing');
  const { tokenIds, logprobs } = checkSampledTokens(ids, raw, expect, { ids: idName, logprobs: (i) => `token_logprobs[${i}]` });
  // Both lists given (return_token_ids and return_tokens_as_token_ids): the logprobs' tokens are those very ids, one
  // for one — a list that lost or gained entries would pair each logprob with another token.
  if (Array.isArray(echoed) && Array.isArray(tokens)) checkSameTokens(tokenIds, tokens);

  const finishReason = checkFinishReason(choice.finish_reason);
  const text = choice.text;
  if (typeof text !== 'string') throw new CompletionRejected(`choices[0].text is ${preview(text)}, not a string`);
  const usage = json.usage;
  checkTokenCount(tokenIds.length, finishReason, expect, isRecord(usage) ? usage.completion_tokens : undefined, 'usage.completion_tokens');
  checkPromptCount(tokenIds.length, expect, isRecord(usage) ? usage.prompt_tokens : undefined, 'usage.prompt_tokens');
  return { tokenIds, logprobs, finishReason, text };
}

/**
 * The prompt an answer says it answered is the request's: an engine counts the prompt ids it was sent (vLLM
 * `usage.prompt_tokens`), so another count means an answer to another request — a faulty engine or proxy that answers
 * one request twice, the copy then read on the keep-alive connection as the next request's answer — whose tokens were
 * sampled from another context. Unchecked when the prompt is not known (`expect.promptIds`) or the count not stated,
 * and for an answer without tokens (nothing of it enters a trajectory).
 */
export function checkPromptCount(sampled: number, expect: CompletionExpectation, stated: unknown, statedName: string): void {
  if (sampled === 0 || expect.promptIds === undefined || stated === undefined || stated === null) return;
  if (stated !== expect.promptIds.length) {
    throw new AnswerMisdelivered(`${statedName} = ${preview(stated)}, but the request's prompt has ${expect.promptIds.length} ids (an answer to another request?)`);
  }
}

/**
 * The request an answer says it answers is this one: SGLang names each answer by its request's rid (`meta_info.id`,
 * tokenizer_manager.py), so another id is an answer meant for another request — even one whose prompt has the same
 * length (the samples of a GRPO group share their first prompt), which {@link checkPromptCount} cannot tell apart.
 * Unchecked when the request sent no id or the answer states none.
 */
export function checkAnswerId(expect: CompletionExpectation, stated: unknown, statedName: string, sentName: string): void {
  if (expect.requestId === undefined || stated === undefined || stated === null) return;
  if (stated !== expect.requestId) {
    throw new AnswerMisdelivered(`${statedName} = ${preview(stated)}, but the request's ${sentName} is ${preview(expect.requestId)} (an answer to another request?)`);
  }
}

/** `tokens` (logprobs.tokens) names the same ids as token_ids, in order, wherever it names them as "token_id:<id>". */
function checkSameTokens(tokenIds: readonly number[], tokens: readonly unknown[]): void {
  if (tokens.length !== tokenIds.length) throw new CompletionRejected(`${tokenIds.length} token_ids but ${tokens.length} logprobs.tokens`);
  for (let i = 0; i < tokens.length; i++) {
    const id = tokenIdOf(tokens[i]);
    if (id >= 0 && id !== tokenIds[i]) throw new CompletionRejected(`logprobs.tokens[${i}] = ${preview(tokens[i])} but token_ids[${i}] = ${tokenIds[i]}`);
  }
}

/** `"token_id:<decimal>"` as vLLM's return_tokens_as_token_ids writes a token (format_token_id_placeholder). */
const TOKEN_ID_PREFIX = 'token_id:';

/**
 * The id of a `"token_id:<decimal>"` token — decimal digits, at most 16, no leading zero but "0" itself — or -1 for
 * anything else. Read by hand: this runs for every sampled token, and a regex match allocated an array per token.
 */
export function tokenIdOf(token: unknown): number {
  if (typeof token !== 'string' || !token.startsWith(TOKEN_ID_PREFIX)) return -1;
  const digits = token.length - TOKEN_ID_PREFIX.length;
  if (digits < 1 || digits > 16) return -1;
  const first = token.charCodeAt(TOKEN_ID_PREFIX.length);
  if (first === 48) return digits === 1 ? 0 : -1;
  let id = 0;
  for (let i = TOKEN_ID_PREFIX.length; i < token.length; i++) {
    const c = token.charCodeAt(i);
    if (c < 48 || c > 57) return -1;
    id = id * 10 + (c - 48);
  }
  return id;
}

/** The ids of vLLM's `"token_id:<id>"` tokens (range checks are checkSampledTokens'); refuses anything else. */
function tokenIdsOfTokens(tokens: readonly unknown[], maxTokens: number): number[] {
  if (tokens.length > maxTokens) throw new CompletionRejected(`${tokens.length} token ids for max_tokens ${maxTokens}`);
  const ids = new Array<number>(tokens.length);
  for (let i = 0; i < tokens.length; i++) {
    const id = tokenIdOf(tokens[i]);
    if (id < 0) throw new CompletionRejected(`logprobs.tokens[${i}] = ${preview(tokens[i])} is not "token_id:<id>" (return_tokens_as_token_ids)`);
    ids[i] = id;
  }
  return ids;
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** A short, safe rendering of an offending value (never stringifies a whole structure). */
export function preview(value: unknown): string {
  if (value === null || value === undefined) return String(value);
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'object') return 'an object';
  if (typeof value === 'string') return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  return String(value);
}
