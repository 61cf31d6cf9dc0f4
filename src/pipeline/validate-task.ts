import { existsSync } from 'node:fs';
import { RolloutError } from '../errors.js';
import { MAX_TIMER_MS } from '../timers.js';
import type { ServerConfig } from '../config.js';
import type { EnvironmentRegistry } from '../environments/registry.js';
import type { Environment, StageTimeouts } from '../environments/types.js';
import { checkRequestedImage, sandboxMemoryMb, type SandboxRequest } from '../sandboxes/spec.js';
import { StalenessAction, type TaskSpec } from '../../gen/ts/rollout/v1/rollout.js';
import type { ResolvedTask, StalenessAction as Action } from './task.js';
import { canonicalJson } from './canonical-json.js';
import type { TokenWork } from '../tokens/token-work.js';
import { toolSchemas } from '../tools/registry.js';
import { disposeTools } from '../tools/dispose-tools.js';
import type { ToolSchema } from '../tokens/types.js';
import type { Logger } from '../observability/logger.js';

/** What admission needs to measure a prompt against the token budget. */
export interface PromptBudget {
  /** Renders and tokenizes the prompt as the run stage's ledger will (and caches it for the ledger). */
  work: TokenWork;
  /** The smallest max_model_len among the backends that stated one (undefined when none did). */
  maxModelLen(): number | undefined;
  /** Where failures to dispose the tools made for the check are logged. */
  logger?: Logger;
}

/** Longest id (task, group, session) or environment name, in UTF-16 units. */
export const MAX_ID_LENGTH = 256;
const MAX_STOP_SEQUENCES = 16;
const MAX_METADATA_ENTRIES = 64;
const MAX_METADATA_BYTES = 16_384;

/**
 * Refuses an id (task, group, session, environment name) over MAX_ID_LENGTH characters, naming `field`: ids are map
 * keys, log fields and quoted in answers, so every RPC that takes one bounds it before using it.
 */
export function checkIdLength(field: string, id: string): void {
  if (id.length > MAX_ID_LENGTH) throw RolloutError.invalid(field, `longer than ${MAX_ID_LENGTH} characters`);
}

/** What a TaskSpec field may take on the wire before it is decoded (see {@link taskWireBounds}). */
export interface WireBound {
  bytes: number;
  /** Why it is refused, given its size on the wire. */
  reason: (bytes: number) => string;
}

/**
 * A Struct takes at most this many times its JSON size on the wire: a number in a list is 11 bytes there (tag,
 * length, tag, 8-byte double) and 2 as JSON ("0,"); every other value costs less per JSON byte.
 */
const STRUCT_WIRE_PER_JSON_BYTE = 6;

/**
 * Upper bounds, by TaskSpec field name, of what each field of a task that passes {@link validateTask} can take on the
 * wire (tags and repeated entries included), with room to spare. A field beyond its bound is refused before the
 * request is decoded (see tolerantService): otherwise a 60 MiB instance or a metadata map of a million entries is
 * decoded into objects on the event loop only to be refused by size afterwards. Fields not named are small scalars.
 */
export function taskWireBounds(maxInstanceBytes: number): Readonly<Record<string, WireBound>> {
  // A character is at most 3 bytes of UTF-8 per UTF-16 unit; tag and length add at most 6.
  const id: WireBound = { bytes: 3 * MAX_ID_LENGTH + 6, reason: () => `longer than ${MAX_ID_LENGTH} characters` };
  return {
    task_id: id,
    group_id: id,
    environment: id,
    instance: {
      bytes: STRUCT_WIRE_PER_JSON_BYTE * maxInstanceBytes + 64,
      reason: (n) => `too large: ${n} bytes on the wire, more than an instance of at most ${maxInstanceBytes} bytes (as JSON) takes`,
    },
    // Stop sequences are the only variable part: at most MAX_STOP_SEQUENCES of 256 characters.
    sampling: { bytes: MAX_STOP_SEQUENCES * (3 * 256 + 6) + 1024, reason: (n) => `too large: ${n} bytes on the wire (at most ${MAX_STOP_SEQUENCES} stop sequences of 1–256 characters)` },
    limits: { bytes: 1024, reason: (n) => `too large: ${n} bytes on the wire` },
    // An entry takes about its JSON size (`"k":"v",`: UTF-8 as on the wire) plus a few bytes of tags and lengths.
    metadata: { bytes: 2 * MAX_METADATA_BYTES + 16 * MAX_METADATA_ENTRIES, reason: () => `larger than ${MAX_METADATA_BYTES} bytes` },
  };
}

/**
 * Validates a TaskSpec and applies server defaults. Throws RolloutError.invalid(field, reason) naming the first
 * offending field, so the trainer can fix its spec; nothing here touches pipeline state. The prompt's length is
 * checked apart, by {@link checkPromptFits}, since tokenizing a long prompt is work for a token thread.
 */
export function validateTask(spec: TaskSpec, registry: EnvironmentRegistry, config: ServerConfig): ResolvedTask {
  const taskId = spec.taskId;
  if (!taskId) throw RolloutError.invalid('task_id', 'required');
  checkIdLength('task_id', taskId);
  checkIdLength('group_id', spec.groupId);
  if (spec.numSamples <= 0) throw RolloutError.invalid('num_samples', `must be at least 1, got ${spec.numSamples}`);
  if (spec.numSamples > config.maxNumSamples) {
    throw RolloutError.invalid('num_samples', `at most ${config.maxNumSamples}, got ${spec.numSamples}`);
  }
  if (!spec.environment) throw RolloutError.invalid('environment', 'required');
  // Before the registry: its refusal quotes the name.
  checkIdLength('environment', spec.environment);
  const environment = registry.get(spec.environment);

  if (spec.instance === undefined) throw RolloutError.invalid('instance', 'required');
  const instanceJson = JSON.stringify(spec.instance);
  if (Buffer.byteLength(instanceJson) > config.maxInstanceBytes) {
    throw RolloutError.invalid('instance', `too large: ${Buffer.byteLength(instanceJson)} bytes > ${config.maxInstanceBytes}`);
  }
  const instance = environment.validate(spec.instance);
  checkSandboxRequest(environment, instance, spec.instance, config);

  const s = spec.sampling;
  if (s?.temperature !== undefined && !(Number.isFinite(s.temperature) && s.temperature >= 0 && s.temperature <= 100)) {
    throw RolloutError.invalid('sampling.temperature', `must be in [0, 100], got ${s.temperature}`);
  }
  if (s?.topP !== undefined && !(Number.isFinite(s.topP) && s.topP > 0 && s.topP <= 1)) {
    throw RolloutError.invalid('sampling.top_p', `must be in (0, 1], got ${s.topP}`);
  }
  if (s?.topK !== undefined && (s.topK < -1 || s.topK === 0)) {
    throw RolloutError.invalid('sampling.top_k', `must be -1 (off) or positive, got ${s.topK}`);
  }
  nonNegative('sampling.max_tokens_per_turn', s?.maxTokensPerTurn ?? 0);
  nonNegative('sampling.max_total_tokens', s?.maxTotalTokens ?? 0);
  const stop = s?.stop ?? [];
  if (stop.length > MAX_STOP_SEQUENCES) throw RolloutError.invalid('sampling.stop', `at most ${MAX_STOP_SEQUENCES} sequences`);
  if (stop.some((x) => x.length === 0 || x.length > 256)) throw RolloutError.invalid('sampling.stop', 'each stop sequence must be 1–256 characters');

  const l = spec.limits;
  const stageBudgets = resolveStageBudgets(l, environment.stageTimeouts, config);
  for (const [field, value] of [
    ['limits.max_turns', l?.maxTurns],
    ['limits.init_timeout_ms', l?.initTimeoutMs],
    ['limits.run_timeout_ms', l?.runTimeoutMs],
    ['limits.eval_timeout_ms', l?.evalTimeoutMs],
    ['limits.total_timeout_ms', l?.totalTimeoutMs],
  ] as const) {
    nonNegative(field, value ?? 0);
  }
  if (l?.maxStaleness !== undefined) nonNegative('limits.max_staleness', l.maxStaleness);
  const stalenessAction = stalenessActionOf(l?.stalenessAction);

  const metadataEntries = Object.entries(spec.metadata);
  if (metadataEntries.length > MAX_METADATA_ENTRIES) throw RolloutError.invalid('metadata', `at most ${MAX_METADATA_ENTRIES} entries`);
  if (Buffer.byteLength(JSON.stringify(spec.metadata)) > MAX_METADATA_BYTES) throw RolloutError.invalid('metadata', `larger than ${MAX_METADATA_BYTES} bytes`);

  const d = config.defaults;
  const maxTotalTokens = orDefault(s?.maxTotalTokens, d.maxTotalTokens);
  const maxTokensPerTurn = Math.min(orDefault(s?.maxTokensPerTurn, d.maxTokensPerTurn), maxTotalTokens);
  const resolved = {
    taskId,
    groupId: spec.groupId || taskId,
    numSamples: spec.numSamples,
    environment,
    instance,
    sampling: {
      ...(s?.temperature !== undefined && { temperature: s.temperature }),
      ...(s?.topP !== undefined && { topP: s.topP }),
      ...(s?.topK !== undefined && { topK: s.topK }),
      ...(s?.seed !== undefined && { seed: s.seed }),
      maxTokensPerTurn,
      maxTotalTokens,
      stop: [...stop],
    },
    limits: {
      maxTurns: orDefault(l?.maxTurns, d.maxTurns),
      ...stageBudgets,
      ...(l?.maxStaleness !== undefined && { maxStaleness: l.maxStaleness }),
      stalenessAction,
    },
    metadata: { ...spec.metadata },
    includeMessages: spec.includeMessages,
  };
  // The task as the server will run it, keys sorted at every depth: a retry whose Struct or map entries arrive in
  // another order (Go randomises map iteration), or that spells a default explicitly, is the same task.
  const { environment: env, instance: _validated, ...rest } = resolved;
  return { ...resolved, fingerprint: canonicalJson({ ...rest, environment: env.name, instance: spec.instance }) };
}

/**
 * For an environment that can say its first messages without a sandbox (`Environment.prompt`): renders and
 * tokenizes them exactly as the run stage's ledger will (through the same TokenWork, whose prompt cache makes the
 * ledger's prompt a hit; on a token thread when long) and refuses the task (invalid_argument, field `instance`)
 * when the prompt alone fills the budget: min(max_total_tokens, smallest known max_model_len). So a sample that
 * cannot produce a token never runs.
 */
export async function checkPromptFits(task: ResolvedTask, budget: PromptBudget, signal?: AbortSignal): Promise<void> {
  const { environment, instance } = task;
  if (!environment.prompt) return;
  const maxTotalTokens = task.sampling.maxTotalTokens;
  const messages = environment.prompt(instance);
  // Tool instances are per sample (Tool.dispose): the set made here for its schemas is disposed like a sample's —
  // not awaited, so a slow dispose never holds the task's acceptance (disposeTools bounds and logs it, never throws).
  const tools = environment.tools(instance);
  let schemas: readonly ToolSchema[];
  try {
    schemas = toolSchemas(tools);
  } finally {
    void disposeTools(tools, budget.logger);
  }
  // Kept for the task's samples: their ledgers take it from the cache instead of rendering and encoding it again.
  const promptTokens = (await budget.work.promptIds(messages, schemas, signal, task.numSamples, task)).length;
  const maxModelLen = budget.maxModelLen();
  const limit = Math.min(maxTotalTokens, maxModelLen ?? Infinity);
  if (promptTokens >= limit) {
    const model = maxModelLen === undefined ? '' : `, smallest known max_model_len ${maxModelLen}`;
    throw RolloutError.invalid('instance', `prompt is ${promptTokens} tokens, budget is ${limit} = min(max_total_tokens ${maxTotalTokens}${model}): no room left to generate`);
  }
}

/**
 * Refuses here, at submit, a task whose sandbox the init stage would refuse: one whose image lies outside
 * sandbox.imageDirs (INVALID_ARGUMENT naming `instance.image` when the instance names the image there, `instance`
 * otherwise), by the same check the init stage makes; one whose image, inside the dirs, does not exist (a typo in a
 * dataset is bad input, not an infrastructure failure each sample would be retried for; inside the dirs the answer
 * tells nothing the operator did not list); one that needs more memory than one sandbox may have (sandbox.maxMemoryMb,
 * field `instance`). An image that goes missing between submit and init is the sandbox's failure there. An
 * `Environment.sandbox` that throws, or asks for something malformed, is left to the init stage, which reports it.
 */
function checkSandboxRequest(environment: Environment, instance: unknown, given: TaskSpec['instance'], config: ServerConfig): void {
  let request: SandboxRequest | undefined;
  try {
    request = environment.sandbox?.(instance);
  } catch {
    return;
  }
  if (request === undefined) return;
  try {
    sandboxMemoryMb(config.sandbox, request);
  } catch (err) {
    if (err instanceof RolloutError && err.code === 'invalid_argument') throw err;
  }
  const image = request.image;
  if (image === undefined) return;
  const field = given?.image === image ? 'instance.image' : 'instance';
  const checked = checkRequestedImage(config.sandbox, image, field);
  if (image !== config.sandbox.image && !existsSync(checked)) throw RolloutError.invalid(field, `the image ${image} does not exist on this server`);
}

/** The contract's StalenessAction as the pipeline's; unset and UNSPECIFIED are FLAG, unknown values are refused. */
function stalenessActionOf(value: StalenessAction | undefined): Action {
  switch (value) {
    case undefined:
    case StalenessAction.STALENESS_ACTION_UNSPECIFIED:
    case StalenessAction.STALENESS_ACTION_FLAG:
      return 'flag';
    case StalenessAction.STALENESS_ACTION_RESTART:
      return 'restart';
    default:
      throw RolloutError.invalid('limits.staleness_action', `unknown staleness action ${String(value)}`);
  }
}

function nonNegative(field: string, value: number): void {
  if (!Number.isFinite(value) || value < 0) throw RolloutError.invalid(field, `must not be negative, got ${value}`);
}

function orDefault(value: number | undefined, fallback: number): number {
  return value !== undefined && value > 0 ? value : fallback;
}

/**
 * The stage budgets of a task: its own limits, else its environment's defaults, else the server's. The total
 * covers init + run + eval when the environment asked for budgets of its own and the task set no total.
 */
function resolveStageBudgets(
  l: TaskSpec['limits'],
  env: StageTimeouts | undefined,
  config: ServerConfig,
): { initTimeoutMs: number; runTimeoutMs: number; evalTimeoutMs: number; totalTimeoutMs: number } {
  const initTimeoutMs = orDefault(l?.initTimeoutMs, env?.initMs ?? config.init.timeoutMs);
  const runTimeoutMs = orDefault(l?.runTimeoutMs, env?.runMs ?? config.run.timeoutMs);
  const evalTimeoutMs = orDefault(l?.evalTimeoutMs, env?.evalMs ?? config.eval.timeoutMs);
  // The sum of three int32 budgets can pass what a timer holds (Node would fire it after 1 ms): past it, no limit.
  const fallbackTotal = env === undefined ? config.defaults.totalTimeoutMs : Math.min(MAX_TIMER_MS, Math.max(config.defaults.totalTimeoutMs, initTimeoutMs + runTimeoutMs + evalTimeoutMs));
  return { initTimeoutMs, runTimeoutMs, evalTimeoutMs, totalTimeoutMs: orDefault(l?.totalTimeoutMs, fallbackTotal) };
}
