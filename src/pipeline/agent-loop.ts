import { RolloutError, throwIfAborted } from '../errors.js';
import type { BackendPool } from '../backends/pool.js';
import type { BackendLease, LeaseResult } from '../backends/lease.js';
import type { GenerateResult } from '../backends/types.js';
import { ContextOverflowError } from '../backends/context-overflow.js';
import { vocabSize } from '../tokens/vocab.js';
import type { EpisodeOutcome } from '../environments/types.js';
import type { ChatTemplate, Tokenizer } from '../tokens/types.js';
import { TokenLedger } from '../tokens/ledger.js';
import type { Tool, ToolCallParser } from '../tools/types.js';
import { executeToolCalls } from '../tools/execute.js';
import { TOOL_TIME_FINISH_REASON, ToolTimeBudget, type ToolTimeBudgetOptions } from '../tools/tool-time-budget.js';
import { disposeTools } from '../tools/dispose-tools.js';
import type { Logger } from '../observability/logger.js';
import { RateLimitedLog } from '../observability/rate-limited-log.js';
import type { Sandbox } from '../sandboxes/types.js';
import type { TokenWork } from '../tokens/token-work.js';
import { toolSchemas } from '../tools/registry.js';
import { abortedTurnEnd, firstStopToken, stopAcrossBoundary } from './continuation-stop.js';
import type { RunResult, Sample } from './sample.js';
import { segmentSeed } from './seeds.js';
import { exceedsStaleness, VersionTracker } from './staleness.js';
import { yieldIfBusy } from './yield.js';

export interface AgentLoopDeps {
  pool: BackendPool;
  tokenizer: Tokenizer;
  template: ChatTemplate;
  /** Where the ledger renders and tokenizes (token threads for large inputs); inline when absent. */
  tokenWork?: TokenWork;
  parser: ToolCallParser;
  /** Where failures to dispose a sample's tools are logged. */
  logger?: Logger;
  /** How often one turn is asked again after its request was aborted (default 8); then backend_error. */
  maxContinuationsPerTurn?: number;
  /** Tool calls of one assistant message that are run (config `maxToolCallsPerMessage`; default MAX_CALLS_PER_MESSAGE). */
  maxToolCallsPerMessage?: number;
  /**
   * The sample will be restarted once past its max_staleness (staleness_action RESTART with restarts left): the
   * loop then stops as soon as it is (finish_reason "stale"), since nothing sampled later can be kept.
   */
  stopWhenStale?: boolean;
  /**
   * The episode's tool-time budget (see ToolTimeBudget; the run stage derives it from the task's run timeout and the
   * sandbox's wall clock): its tool calls are cut where it ends, and the episode then ends TRUNCATED with finish_reason
   * "tool_time_budget". None: tool calls are bounded by their own timeouts only.
   */
  toolTime?: ToolTimeBudgetOptions;
}

/**
 * The run stage: the multi-turn agent loop of one sample. Each turn sends the ledger's ids (token-in) to the
 * trajectory's sticky backend, appends the sampled ids verbatim (token-out), parses tool calls, runs them in
 * the sample's sandbox and appends the observation as template tokens. Ends on the finish tool, a plain answer
 * (no tool call), or a budget (max_turns, max_total_tokens, a turn cut by max_tokens, the engine's context
 * length, the tool-time budget) — the latter TRUNCATED. Each turn asks for min(max_tokens_per_turn, max_total_tokens − context,
 * max_model_len − context) tokens, max_model_len being the leased engine's; should the engine still refuse the
 * context (its limit unknown or changed), that too ends the episode TRUNCATED with finish_reason "max_model_len".
 * A prompt that leaves no room to generate fails the sample with invalid_argument (INVALID_TASK) before any turn.
 * Every answer is checked by the engine client against the tokenizer's vocabulary. The backend lease is released
 * in `finally`, whatever ends the loop.
 *
 * An answer with finish_reason "abort" (its request was aborted, e.g. by PauseGeneration ABORT during a weight
 * update) is not a failure: what it sampled is recorded (mask 1, its logprobs, the version that sampled it) and the
 * same turn is asked again for the rest — context including the partial tokens, max_tokens reduced by them, the
 * segment's own seed (see segmentSeed) — after the pause, since the pool holds the request until resume — unless its
 * tokens already end the turn (a stop token, a stop string: see abortedTurnEnd), which then ends "stop" there. The
 * ledger keeps each segment as its own span and decodes the message from all of them. An abort with no token is
 * simply asked again, with the same seed (a seeded sample does not depend on when a pause hit it). At most
 * `maxContinuationsPerTurn` continuations per turn, and as many aborts before a first token; then backend_error.
 */
export async function runAgentLoop(sample: Sample, deps: AgentLoopDeps, signal: AbortSignal): Promise<RunResult> {
  const { task } = sample;
  const sandbox = sample.sandbox;
  if (!sandbox) throw new RolloutError('internal', 'run stage without a sandbox');
  const tools = task.environment.tools(task.instance);
  try {
    return await runWithTools(sample, deps, signal, { tools, sandbox });
  } finally {
    // The tools' per-sample life ends with the sample, however it ends.
    await disposeTools(tools, deps.logger);
  }
}

async function runWithTools(sample: Sample, deps: AgentLoopDeps, signal: AbortSignal, { tools, sandbox }: { tools: Tool[]; sandbox: Sandbox }): Promise<RunResult> {
  const { task } = sample;
  const ledger = await TokenLedger.create(
    {
      tokenizer: deps.tokenizer,
      template: deps.template,
      messages: sample.initialMessages,
      tools: toolSchemas(tools),
      promptKeyHint: task,
      ...(deps.tokenWork && { work: deps.tokenWork }),
    },
    signal,
  );
  sample.ledger = ledger;
  const lease = await deps.pool.acquire(sample.key, { signal });
  const { sampling, limits } = task;
  const vocab = vocabSize(deps.tokenizer);
  let finishReason = 'max_turns';
  let truncated = true;
  let finishAnswer: string | undefined;
  let numTurns = 0;
  const versions = new VersionTracker();
  const toolTime = deps.toolTime && new ToolTimeBudget(sandbox, deps.toolTime);
  try {
    for (let turn = 0; turn < limits.maxTurns; turn++) {
      throwIfAborted(signal);
      const context = ledger.totalTokens;
      const totalLeft = sampling.maxTotalTokens - context;
      const modelLeft = lease.maxModelLen === undefined ? Infinity : lease.maxModelLen - context;
      if (turn === 0 && Math.min(totalLeft, modelLeft) <= 0) throw promptTooLong(context, sampling.maxTotalTokens, lease.maxModelLen, lease.backendId);
      if (totalLeft <= 0 || modelLeft <= 0) {
        finishReason = totalLeft <= 0 ? 'max_total_tokens' : 'max_model_len';
        break;
      }
      const maxTokens = Math.min(sampling.maxTokensPerTurn, totalLeft, modelLeft);
      const started = performance.now();
      let sampled: SampledTurnResult;
      try {
        sampled = await sampleTurn({ sample, deps, lease, ledger, vocab, turn, maxTokens, signal });
      } finally {
        // Also a turn that failed or was cut (a deadline, a cancel, an engine error): its time was the engine's.
        sample.timing.llmMs += performance.now() - started;
      }
      if (sampled.tokens > 0) numTurns++;
      if (sampled.overflow) {
        // The engine's context is full: the policy ran out of room (truncation), unless the prompt alone is too long.
        const err = sampled.overflow;
        if (turn === 0 && sampled.tokens === 0 && err.promptTokens !== undefined && err.promptTokens >= err.maxModelLen) {
          throw promptTooLong(context, sampling.maxTotalTokens, err.maxModelLen, lease.backendId);
        }
        finishReason = 'max_model_len';
        break;
      }
      versions.add(...sampled.versions);
      if (deps.stopWhenStale === true && exceedsStaleness(limits, versions)) {
        finishReason = 'stale';
        break;
      }
      // The whole message, over all its segments.
      const parsed = deps.parser.parse(sampled.text);
      if (parsed.calls.length === 0 && parsed.errors.length === 0) {
        // A plain answer ends the episode; one cut by max_tokens is a truncation, not an answer.
        if (sampled.finishReason === 'length') {
          // Fewer tokens than asked, finish "length": cut at the end of the engine's context — by the lease, sizing the
          // request for the engine that served it, or by the engine (vLLM >= 0.3x shortens max_tokens to the room left
          // instead of refusing), a limit the pool may not have known. The pool vouches for that reading: a short
          // "length" answer from an engine whose known limit is far from reached makes it ask the engine again (a
          // restart with a smaller limit is learned) and, if the engine still states that limit, fails as backend_error
          // before it gets here (checkShortLength in backends/short-length.ts). The context is then the label even when the turn was
          // sized by max_total_tokens: that budget was not reached.
          const engineCut = sampled.tokens < maxTokens;
          finishReason = engineCut ? 'max_model_len' : maxTokens === totalLeft ? 'max_total_tokens' : maxTokens === modelLeft ? 'max_model_len' : 'max_tokens_per_turn';
        } else {
          finishReason = 'answer';
          truncated = false;
        }
        break;
      }
      // The calls' time ran out during the engine's turn (a tool call's own overrun ends the episode below, after it):
      // the engine held the clock, not the policy's tools — TIMEOUT now, not "budget used up" (TRUNCATED).
      const clockOut = toolTime?.clockOutsideTools();
      if (clockOut) throw clockOut;
      const toolStarted = performance.now();
      const observations = await executeToolCalls(parsed, tools, { sandbox, signal }, {
        ...(deps.maxToolCallsPerMessage !== undefined && { maxCallsPerMessage: deps.maxToolCallsPerMessage }),
        ...(toolTime && { toolTime }),
      });
      sample.timing.toolMs += performance.now() - toolStarted;
      const finish = observations.find((o) => o.outcome === 'finish');
      if (finish) {
        finishReason = 'finish_tool';
        finishAnswer = finish.answer ?? '';
        truncated = false;
        break;
      }
      // The model's calls used up the episode's tool time (a call was cut where it ended): the policy's outcome, like a
      // token budget — TRUNCATED and evaluated, never TIMEOUT.
      if (toolTime?.exhausted === true) {
        finishReason = TOOL_TIME_FINISH_REASON;
        break;
      }
      if (turn + 1 >= limits.maxTurns) break;
      // What the tools printed counts against the budget too: a trajectory never holds more than its budget, so an
      // observation that does not fit ends the episode (truncated) without it.
      const appended = await ledger.appendEnvironment(
        observations.map((o) => ({ role: 'tool' as const, content: o.output, name: o.toolName })),
        {
          toolName: observations.map((o) => o.toolName).join(','),
          toolOutcome: worstOutcome(observations.map((o) => o.outcome)),
          maxTotalTokens: Math.min(sampling.maxTotalTokens, lease.maxModelLen ?? Infinity),
        },
        signal,
      );
      if (!appended) {
        finishReason = lease.maxModelLen !== undefined && lease.maxModelLen < sampling.maxTotalTokens ? 'max_model_len' : 'max_total_tokens';
        break;
      }
    }
  } finally {
    lease.release();
  }
  const outcome: EpisodeOutcome = {
    messages: ledger.messages,
    finishReason,
    ...(finishAnswer !== undefined && { finishAnswer }),
  };
  return { outcome, tokens: ledger.snapshot(), truncated, numTurns };
}

/** A prompt that leaves no token to generate: the task cannot run as given (INVALID_TASK, field instance). */
function promptTooLong(promptTokens: number, maxTotalTokens: number, maxModelLen: number | undefined, backend: string): RolloutError {
  const budget = Math.min(maxTotalTokens, maxModelLen ?? Infinity);
  const limit = maxModelLen === undefined ? '' : `, max_model_len ${maxModelLen} of backend ${backend}`;
  return RolloutError.invalid(
    'instance',
    `prompt is ${promptTokens} tokens, budget is ${budget} = min(max_total_tokens ${maxTotalTokens}${limit}): no room left to generate`,
  );
}

/** What one turn's engine requests gave: the message's text so far and how its last segment ended. */
interface SampledTurnResult {
  text: string;
  /** Sampled tokens recorded for the turn, over all its segments. */
  tokens: number;
  /** The turn's finish: its last segment's, or "length" when an abort left no token of the turn's budget. */
  finishReason: GenerateResult['finishReason'];
  /** The policy versions of its segments (start and end of each). */
  versions: number[];
  /** The engine refused the context: the turn ends there (its segments so far stay recorded). */
  overflow?: ContextOverflowError;
}

/**
 * Samples one assistant turn into the ledger: one engine request, and another for the rest each time one comes
 * back "abort" (see runAgentLoop), bounded by maxContinuationsPerTurn.
 */
async function sampleTurn(ctx: {
  sample: Sample;
  deps: AgentLoopDeps;
  lease: BackendLease;
  ledger: TokenLedger;
  vocab: number;
  turn: number;
  maxTokens: number;
  signal: AbortSignal;
}): Promise<SampledTurnResult> {
  const { sample, deps, lease, ledger, turn, maxTokens, signal } = ctx;
  const { sampling } = sample.task;
  const maxContinuations = deps.maxContinuationsPerTurn ?? 8;
  const out: SampledTurnResult = { text: '', tokens: 0, finishReason: 'length', versions: [] };
  // `segment` counts the turn's recorded segments (its seed is the segment's: segment 0 has the turn's usual seed,
  // however many times a request was aborted before its first token); aborts that recorded nothing are bounded apart.
  let emptyAborts = 0;
  let overflowRetried = false;
  for (let segment = 0; ; ) {
    if (segment > maxContinuations) {
      throw new RolloutError('backend_error', `turn ${turn} was aborted ${segment} times by engine ${lease.backendId} (at most ${maxContinuations} continuations per turn)`);
    }
    for (let loopTurn = yieldIfBusy(); loopTurn; loopTurn = yieldIfBusy()) await loopTurn;
    let result: LeaseResult;
    try {
      result = await lease.generate({
        promptIds: ledger.contextIds(),
        maxTokens: maxTokens - out.tokens,
        vocabSize: ctx.vocab,
        ...(sampling.temperature !== undefined && { temperature: sampling.temperature }),
        ...(sampling.topP !== undefined && { topP: sampling.topP }),
        ...(sampling.topK !== undefined && { topK: sampling.topK }),
        // Samples of a group must differ: a task seed becomes one seed per sample, turn and segment.
        ...(sampling.seed !== undefined && { seed: segmentSeed(sampling.seed, sample.index, turn, segment) }),
        ...(sampling.stop.length > 0 && { stop: sampling.stop }),
        stopTokenIds: deps.tokenizer.stopTokenIds,
        signal,
      });
    } catch (err) {
      if (!(err instanceof ContextOverflowError) || signal.aborted) throw err;
      // Refused for max_tokens, not for the context: the request was sized before the engine's limit was known (the
      // pool learns it from this very answer). Asked once more, the lease sizes it to the room left (a turn never
      // ends TRUNCATED over a limit the server had not learned yet).
      const context = ledger.totalTokens;
      if (!overflowRetried && context < err.maxModelLen && (err.promptTokens === undefined || err.promptTokens < err.maxModelLen) && lease.maxModelLen === err.maxModelLen) {
        overflowRetried = true;
        continue;
      }
      out.overflow = err;
      return out;
    }
    // Aborted before its first token: nothing to record, ask again (the pool holds it while paused) with the same seed.
    if (result.finishReason === 'abort' && result.tokenIds.length === 0) {
      if (++emptyAborts > maxContinuations) {
        throw new RolloutError('backend_error', `turn ${turn}'s request was aborted before its first token ${emptyAborts} times by engine ${result.backendId} (at most ${maxContinuations})`);
      }
      continue;
    }
    let { tokenIds, logprobs, finishReason } = result;
    const decode = (ids: readonly number[]): string => deps.tokenizer.decode(ids);
    const earlierIds = out.tokens > 0 ? ledger.messageIds() : [];
    // Aborted after its turn had ended (a stop token sampled, a stop string completed): the turn ends there, as the
    // uninterrupted request's would have — continued, it would sample past its end. A continuation: a stop string
    // begun before the abort is no match for the engine (see continuation-stop.ts).
    let keep =
      finishReason === 'abort'
        ? abortedTurnEnd(earlierIds, tokenIds, sampling.stop, deps.tokenizer.stopTokenIds, decode)
        : out.tokens > 0
          ? stopAcrossBoundary(earlierIds, tokenIds, sampling.stop, decode)
          : undefined;
    // Sampled on past a stop token: the engine stops at its model's generation_config ids, and one without an id this
    // tokenizer ends turns with (a base model's <|endoftext|> only, turns closed by <|im_end|>) goes on into text the
    // turn never holds (a forged next turn). The turn ends at that token, as it would have on an engine told about it;
    // what is kept is still exactly what was sampled (review-s37-past-stop-token).
    if (finishReason !== 'abort') {
      const stopToken = firstStopToken(tokenIds, deps.tokenizer.stopTokenIds);
      if (stopToken >= 0 && stopToken < tokenIds.length - 1 && (keep === undefined || stopToken + 1 < keep)) {
        pastStopLog(deps.logger)?.write('warn', { backend: result.backendId, stopTokenId: tokenIds[stopToken], dropped: tokenIds.length - stopToken - 1 },
          'engine sampled past a stop token (its model\'s generation_config lacks it?): the turn ends at the token, the ids after it are dropped');
        keep = stopToken + 1;
      }
    }
    if (keep !== undefined) {
      tokenIds = tokenIds.slice(0, keep);
      logprobs = logprobs.slice(0, keep);
      finishReason = 'stop';
    }
    // Cut by max_tokens on the very token that ends the turn: vLLM v1 checks the length cap before the stop token
    // (check_stop), so a complete turn can come back "length". Its end-of-turn token was sampled: it ended, and is
    // no truncation (review-s36-length-on-stop-token).
    if (finishReason === 'length' && tokenIds.length > 0 && deps.tokenizer.stopTokenIds.includes(tokenIds[tokenIds.length - 1]!)) finishReason = 'stop';
    out.text = ledger.appendSampled({
      tokenIds,
      logprobs,
      backend: result.backendId,
      policyVersion: result.policyVersion,
      policyVersionStart: result.policyVersionStart,
      finishReason,
      logprobsMode: result.logprobsMode,
    });
    out.tokens += tokenIds.length;
    out.versions.push(result.policyVersionStart, result.policyVersion);
    out.finishReason = finishReason;
    if (finishReason !== 'abort') return out;
    // Aborted with the whole budget sampled: the turn is as long as it may be.
    if (out.tokens >= maxTokens) {
      out.finishReason = 'length';
      return out;
    }
    segment++;
  }
}

type Outcome = 'ok' | 'error' | 'malformed' | 'finish';
function worstOutcome(outcomes: Outcome[]): Outcome {
  if (outcomes.includes('malformed')) return 'malformed';
  if (outcomes.includes('error')) return 'error';
  return 'ok';
}

/** One rate-limited log per pipeline logger for answers past a stop token: a misconfigured engine sends them all. */
const pastStopLogs = new WeakMap<Logger, RateLimitedLog>();
function pastStopLog(logger: Logger | undefined): RateLimitedLog | undefined {
  if (logger === undefined) return undefined;
  let log = pastStopLogs.get(logger);
  if (log === undefined) pastStopLogs.set(logger, (log = new RateLimitedLog(logger, { linesPerSecond: 0.1, burst: 3 })));
  return log;
}
