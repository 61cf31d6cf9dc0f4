import { RolloutError, throwIfAborted } from '../errors.js';
import type { BackendPool } from '../backends/pool.js';
import type { EpisodeOutcome } from '../environments/types.js';
import type { ChatTemplate, Tokenizer } from '../tokens/types.js';
import { TokenLedger } from '../tokens/ledger.js';
import type { ToolCallParser } from '../tools/types.js';
import { executeToolCalls } from '../tools/execute.js';
import { toolSchemas } from '../tools/registry.js';
import type { RunResult, Sample } from './sample.js';
import { turnSeed } from './seeds.js';

export interface AgentLoopDeps {
  pool: BackendPool;
  tokenizer: Tokenizer;
  template: ChatTemplate;
  parser: ToolCallParser;
}

/**
 * The run stage: the multi-turn agent loop of one sample. Each turn sends the ledger's ids (token-in) to the
 * trajectory's sticky backend, appends the sampled ids verbatim (token-out), parses tool calls, runs them in
 * the sample's sandbox and appends the observation as template tokens. Ends on the finish tool, a plain answer
 * (no tool call), or a budget (max_turns, max_total_tokens, a turn cut by max_tokens) — the latter TRUNCATED.
 * The backend lease is released in `finally`, whatever ends the loop.
 */
export async function runAgentLoop(sample: Sample, deps: AgentLoopDeps, signal: AbortSignal): Promise<RunResult> {
  const { task } = sample;
  const sandbox = sample.sandbox;
  if (!sandbox) throw new RolloutError('internal', 'run stage without a sandbox');
  const tools = task.environment.tools(task.instance);
  const ledger = new TokenLedger({
    tokenizer: deps.tokenizer,
    template: deps.template,
    messages: sample.initialMessages,
    tools: toolSchemas(tools),
  });
  sample.ledger = ledger;
  const lease = await deps.pool.acquire(sample.key, { signal });
  const { sampling, limits } = task;
  let finishReason = 'max_turns';
  let truncated = true;
  let finishAnswer: string | undefined;
  let numTurns = 0;
  try {
    for (let turn = 0; turn < limits.maxTurns; turn++) {
      throwIfAborted(signal);
      const budget = sampling.maxTotalTokens - ledger.totalTokens;
      if (budget <= 0) {
        finishReason = 'max_total_tokens';
        break;
      }
      const started = performance.now();
      const result = await lease.generate({
        promptIds: ledger.contextIds(),
        maxTokens: Math.min(sampling.maxTokensPerTurn, budget),
        ...(sampling.temperature !== undefined && { temperature: sampling.temperature }),
        ...(sampling.topP !== undefined && { topP: sampling.topP }),
        ...(sampling.topK !== undefined && { topK: sampling.topK }),
        // Samples of a group must differ: a task seed becomes one seed per sample and turn.
        ...(sampling.seed !== undefined && { seed: turnSeed(sampling.seed, sample.index, turn) }),
        ...(sampling.stop.length > 0 && { stop: sampling.stop }),
        signal,
      });
      sample.timing.llmMs += performance.now() - started;
      if (result.finishReason === 'abort') {
        // The engine dropped the request (e.g. during a weight update): not an answer, never scored.
        throw new RolloutError('backend_error', `engine ${result.backendId} aborted the generation`);
      }
      numTurns++;
      const text = ledger.appendSampled({
        tokenIds: result.tokenIds,
        logprobs: result.logprobs,
        backend: result.backendId,
        policyVersion: result.policyVersion,
        finishReason: result.finishReason,
      });
      const parsed = deps.parser.parse(text);
      if (parsed.calls.length === 0 && parsed.errors.length === 0) {
        // A plain answer ends the episode; one cut by max_tokens is a truncation, not an answer.
        if (result.finishReason === 'length') finishReason = budget <= sampling.maxTokensPerTurn ? 'max_total_tokens' : 'max_tokens_per_turn';
        else {
          finishReason = 'answer';
          truncated = false;
        }
        break;
      }
      const toolStarted = performance.now();
      const observations = await executeToolCalls(parsed, tools, { sandbox, signal });
      sample.timing.toolMs += performance.now() - toolStarted;
      const finish = observations.find((o) => o.outcome === 'finish');
      if (finish) {
        finishReason = 'finish_tool';
        finishAnswer = finish.answer ?? '';
        truncated = false;
        break;
      }
      if (turn + 1 >= limits.maxTurns) break;
      ledger.appendEnvironment(
        observations.map((o) => ({ role: 'tool' as const, content: o.output, name: o.toolName })),
        { toolName: observations.map((o) => o.toolName).join(','), toolOutcome: worstOutcome(observations.map((o) => o.outcome)) },
      );
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

type Outcome = 'ok' | 'error' | 'malformed' | 'finish';
function worstOutcome(outcomes: Outcome[]): Outcome {
  if (outcomes.includes('malformed')) return 'malformed';
  if (outcomes.includes('error')) return 'error';
  return 'ok';
}
